package store

// RateCounts is what one gateway counted, for the rate-limited routes it
// serves, in the current window of each: published on
// Names.RateCountsSubject every ~250 ms (a heartbeat with no routes when
// nothing changed), read by every other gateway to sum the fleet's count.
type RateCounts struct {
	Gateway string `json:"gateway"`
	// Routes is at most MaxRateCountKeys keys over all its entries; a
	// gateway with more sends several messages.
	Routes []RateRouteCounts `json:"routes,omitempty"`
}

// RateRouteCounts are one route's counts in one window.
type RateRouteCounts struct {
	// Route names the route and its limit's shape
	// ("ns/service/index/window/key"): gateways count together only what
	// they limit alike.
	Route string `json:"route"`
	// Window is the window's index: its start (Unix time) divided by its
	// length, the same at every gateway whose clock is right.
	Window int64 `json:"window"`
	// Keys are hashes (FNV-1a, 64 bits) of what is counted apart (a
	// client IP, a header's value): never the value itself, which may be
	// a secret. Counts[i] is Keys[i]'s count.
	Keys   []uint64 `json:"keys"`
	Counts []int64  `json:"counts"`
}

// MaxRateCountKeys bounds the keys of one RateCounts message (about 40
// bytes of JSON each).
const MaxRateCountKeys = 1000

package caddymodule

import "sync/atomic"

// featuresOff turns default features of the request path off for
// BenchmarkGatewayFeatures, which reports what each one costs against
// stock Caddy. Only the features no config can turn off are here (health
// probes, access lines, layer 4 and canaries have their own settings);
// nothing but that benchmark sets these, and on the request path each
// costs one atomic load.
var featuresOff struct {
	// abandon: round trips are not registered for abandonment.
	abandon atomic.Bool
	// traffic: requests are neither counted nor logged (the access line
	// is written from the counting wrapper).
	traffic atomic.Bool
	// requestIDs: no X-Request-ID or traceparent is set.
	requestIDs atomic.Bool
	// locality: the gateway serves as if no region were known.
	locality atomic.Bool
}

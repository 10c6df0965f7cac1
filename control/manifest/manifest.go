// Package manifest reads and validates deploy manifests (YAML or JSON). A
// manifest that fails validation reports every problem with its field path
// and is never applied. It also makes the password hashes a route's
// basic_auth holds (password.go), beside the rules that check them.
package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/idna"
	"gopkg.in/yaml.v3"

	"github.com/edgeplane/edgeplane/store"
)

// MaxSize bounds a manifest file; anything larger is refused unread.
const MaxSize = 1 << 20

// Limits on what one manifest may ask for.
const (
	MaxReplicas         = 1000
	MaxReadinessTimeout = 10 * time.Minute
	DefaultReadiness    = 30 * time.Second
)

// Problem is one validation failure at a field path.
type Problem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (p Problem) String() string { return p.Path + ": " + p.Message }

// Error lists every problem found in a manifest.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.summary())
	b.WriteString(":")
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// summary is "invalid manifest (N problems)".
func (e *Error) summary() string {
	if len(e.Problems) == 1 {
		return "invalid manifest (1 problem)"
	}
	return fmt.Sprintf("invalid manifest (%d problems)", len(e.Problems))
}

// Structured returns the problems as a structured error for other processes:
// the message counts them and the detail names each by its field path, so
// every problem is listed once.
func (e *Error) Structured() *store.Error {
	se := &store.Error{Code: store.CodeInvalid, Message: e.summary(), Detail: map[string]string{}}
	for _, p := range e.Problems {
		se.Detail[p.Path] = p.Message
	}
	return se
}

// ReadFile reads and validates the manifest at path.
func ReadFile(path string) (*store.Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading manifest %s: %w", path, err)
	}
	return Parse(data)
}

// Parse decodes a YAML or JSON manifest (JSON is YAML), rejecting unknown
// fields, and validates it.
func Parse(data []byte) (*store.Manifest, error) {
	if len(data) > MaxSize {
		return nil, &Error{Problems: []Problem{{Path: "(file)", Message: fmt.Sprintf("larger than %d bytes", MaxSize)}}}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, &Error{Problems: []Problem{{Path: "(file)", Message: "empty manifest"}}}
	}
	var m store.Manifest
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return nil, &Error{Problems: []Problem{{Path: "(syntax)", Message: strings.TrimPrefix(err.Error(), "yaml: ")}}}
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &Error{Problems: []Problem{{Path: "(file)", Message: "more than one document; put one manifest per file"}}}
	}
	if err := Validate(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

var (
	labelRe  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	envKeyRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	lblKeyRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
)

// reservedEnv are set by the agent for every instance.
var reservedEnv = map[string]bool{"HOST": true, "PORT": true}

// Validate checks m, normalising hostnames in place (lower case, no trailing
// dot, IDNA to ASCII), and returns every problem at once.
func Validate(m *store.Manifest) error {
	var ps []Problem
	add := func(path, format string, args ...any) {
		ps = append(ps, Problem{Path: path, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case m.Namespace == "":
		add("namespace", "required")
	case !labelRe.MatchString(m.Namespace):
		add("namespace", "must be a DNS label: lower-case letters, digits and '-', at most 63 characters")
	}
	if m.Services == nil {
		add("services", "required (an empty map removes every service)")
	}
	// owner maps host+prefix to the service that routes it, to catch two
	// services claiming the same traffic.
	owner := map[string]string{}
	var l4 layer4Seen
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		s := m.Services[name]
		p := "services." + name
		if !labelRe.MatchString(name) {
			add(p, "service name must be a DNS label: lower-case letters, digits and '-', at most 63 characters")
		}
		switch {
		case s.Image == "" && (len(s.Command) == 0 || strings.TrimSpace(s.Command[0]) == ""):
			add(p+".command", "required: the program and its arguments (or an image)")
		case s.Image != "" && len(s.Command) > 0 && strings.TrimSpace(s.Command[0]) == "":
			add(p+".command", "with an image: empty (the image's entrypoint) or the program and its arguments")
		}
		if s.Image != "" && !imageRe.MatchString(s.Image) {
			add(p+".image", "not an image reference: registry/name:tag or name@sha256:<64 hex>")
		}
		if s.ImageID != "" && !imageIDRe.MatchString(s.ImageID) {
			add(p+".image_id", "not an image ID: sha256:<64 hex>")
		}
		if s.ImageID != "" && s.Image == "" {
			add(p+".image_id", "only with an image")
		}
		if s.Image == "" && (s.ReadOnly || s.Resources != (store.Resources{})) {
			add(p, "read_only and resources apply to images only")
		}
		if s.Resources.CPUs < 0 {
			add(p+".resources.cpus", "must be >= 0")
		}
		if s.Resources.Memory != "" {
			if _, err := MemoryBytes(s.Resources.Memory); err != nil {
				add(p+".resources.memory", "%v", err)
			}
		}
		if s.Replicas != nil {
			switch r := *s.Replicas; {
			case r < 0:
				add(p+".replicas", "must be >= 0")
			case r > MaxReplicas:
				add(p+".replicas", "must be <= %d", MaxReplicas)
			}
		}
		if s.Port < 0 || s.Port > 65535 {
			add(p+".port", "must be between 1 and 65535, or 0 to let the agent choose")
		}
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			switch {
			case !envKeyRe.MatchString(k):
				add(p+".env."+k, "not a valid environment variable name")
			case reservedEnv[k]:
				add(p+".env."+k, "reserved: the agent sets HOST and PORT")
			}
		}
		if rp := s.Readiness.Path; rp != "" && !strings.HasPrefix(rp, "/") {
			add(p+".readiness.path", "must start with '/'")
		}
		if t := time.Duration(s.Readiness.Timeout); t < 0 || t > MaxReadinessTimeout {
			add(p+".readiness.timeout", "must be between 0 and %s", MaxReadinessTimeout)
		}
		for i := range s.Routes {
			rp := fmt.Sprintf("%s.routes[%d]", p, i)
			r := &s.Routes[i]
			if len(r.Hosts) == 0 {
				add(rp+".hosts", "at least one host is required")
			}
			for j, h := range r.Hosts {
				norm, err := NormalizeHost(h)
				if err != nil {
					add(fmt.Sprintf("%s.hosts[%d]", rp, j), "%v", err)
					continue
				}
				r.Hosts[j] = norm
			}
			for j, pre := range r.PathPrefixes {
				if !strings.HasPrefix(pre, "/") {
					add(fmt.Sprintf("%s.path_prefixes[%d]", rp, j), "must start with '/'")
				}
			}
			prefixes := r.PathPrefixes
			if len(prefixes) == 0 {
				prefixes = []string{"/"}
			}
			validatePolicy(rp, r, add)
			validateIPLists(rp, r, add)
			validateRateLimit(rp, r, add)
			validateAuth(rp, r, m.Services, add)
			validateErrorPages(rp, r, add)
			validateAccessLog(rp, r, add)
			for _, h := range r.Hosts {
				for _, pre := range prefixes {
					k := h + pre
					if other, ok := owner[k]; ok && other != name {
						add(rp, "host %s path %s is already routed to service %s", h, pre, other)
					}
					owner[k] = name
				}
			}
		}
		switch s.Restart {
		case "", store.RestartAlways, store.RestartOnFailure, store.RestartNever:
		default:
			add(p+".restart", "must be always, on-failure or never")
		}
		for _, reg := range s.Placement.Regions {
			if !store.ValidRegion(reg) {
				add(p+".placement.regions", "region %q is not a DNS label", reg)
			}
		}
		validateLocality(p, s, add)
		validateLayer4(p, name, &s, &l4, add)
		for _, k := range slices.Sorted(maps.Keys(s.Placement.Labels)) {
			if !lblKeyRe.MatchString(k) {
				add(p+".placement.labels."+k, "not a valid label key")
			}
		}
		m.Services[name] = s
	}
	validatePassthroughHosts(m, add)
	if r := m.Rollout; r != nil {
		validateRollout(r, add)
	}
	if len(ps) > 0 {
		return &Error{Problems: ps}
	}
	return nil
}

// Limits on a route's policy.
const (
	MaxConnectTimeout        = time.Minute
	MaxResponseHeaderTimeout = time.Hour
	MaxRouteRetries          = 5
)

// hopByHop are header fields a route may not set: they describe one
// connection, and the gateway manages them.
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true}

func validatePolicy(p string, r *store.Route, add func(path, format string, args ...any)) {
	if r.StripPrefix {
		strips := false
		for _, pre := range r.PathPrefixes {
			if pre != "/" && pre != "" {
				strips = true
			}
		}
		if !strips {
			add(p+".strip_prefix", "needs a path prefix other than /")
		}
	}
	for name, ops := range map[string]*store.HeaderOps{"request_headers": r.RequestHeaders, "response_headers": r.ResponseHeaders} {
		if ops == nil {
			continue
		}
		hp := p + "." + name
		for verb, m := range map[string]map[string]string{"set": ops.Set, "add": ops.Add} {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				switch {
				case !tokenRe.MatchString(k):
					add(hp+"."+verb+"."+k, "not a valid header name")
				case hopByHop[http.CanonicalHeaderKey(k)]:
					add(hp+"."+verb+"."+k, "a connection header the gateway manages; it cannot be set")
				case strings.ContainsAny(m[k], "\r\n\x00"):
					add(hp+"."+verb+"."+k, "a header value cannot hold a line break or NUL")
				}
			}
		}
		for i, k := range ops.Delete {
			if !tokenRe.MatchString(k) {
				add(fmt.Sprintf("%s.delete[%d]", hp, i), "not a valid header name")
			}
		}
	}
	if r.MaxRequestBody != "" {
		if _, err := store.ParseByteSize(r.MaxRequestBody); err != nil {
			add(p+".max_request_body", "%v", err)
		}
	}
	if t := r.Timeouts; t != nil {
		if d := time.Duration(t.Connect); d < 0 || d > MaxConnectTimeout {
			add(p+".timeouts.connect", "must be between 0 (the gateway's own) and %s", MaxConnectTimeout)
		}
		if d := time.Duration(t.ResponseHeader); d < 0 || d > MaxResponseHeaderTimeout {
			add(p+".timeouts.response_header", "must be between 0 (the gateway's own) and %s", MaxResponseHeaderTimeout)
		}
	}
	if rt := r.Retries; rt != nil {
		if len(rt.OnStatus) == 0 {
			add(p+".retries.on_status", "at least one status to retry on is required")
		}
		for i, c := range rt.OnStatus {
			if c < 400 || c > 599 {
				add(fmt.Sprintf("%s.retries.on_status[%d]", p, i), "must be an error status, 400 to 599")
			}
		}
		if rt.Max < 0 || rt.Max > MaxRouteRetries {
			add(p+".retries.max", "must be between 1 and %d (0: 1)", MaxRouteRetries)
		}
	}
}

// Limits on a rollout.
const (
	MaxRolloutSteps = 20
	MaxRolloutHold  = 24 * time.Hour
)

// tokenRe is an HTTP token (RFC 9110): a header or cookie name.
var tokenRe = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func validateRollout(r *store.CanarySpec, add func(path, format string, args ...any)) {
	if len(r.Steps) == 0 {
		add("rollout.steps", "at least one step is required")
	}
	if len(r.Steps) > MaxRolloutSteps {
		add("rollout.steps", "at most %d steps", MaxRolloutSteps)
	}
	for i, st := range r.Steps {
		p := fmt.Sprintf("rollout.steps[%d]", i)
		if st.Weight < 0 || st.Weight > 100 {
			add(p+".weight", "must be a percentage between 0 and 100")
		}
		if h := time.Duration(st.Hold); h <= 0 || h > MaxRolloutHold {
			add(p+".hold", "must be a duration between 1s and %s", MaxRolloutHold)
		}
		if i > 0 && r.Sticky && st.Weight < r.Steps[i-1].Weight {
			add(p+".weight", "with sticky, weights may not go down: a client moved to the new revision would move back")
		}
	}
	l := r.Limits
	if l.Max5xxRatio < 0 || l.Max5xxRatio > 1 {
		add("rollout.limits.max_5xx_ratio", "must be a fraction between 0 and 1 (0.01 is one percentage point)")
	}
	if l.MaxP99Ratio != 0 && l.MaxP99Ratio < 1 {
		add("rollout.limits.max_p99_ratio", "must be at least 1 (a multiple of the live revision's p99)")
	}
	if l.MinRequests != nil && *l.MinRequests < 0 {
		add("rollout.limits.min_requests", "must be >= 0")
	}
	if m := r.Match; m != nil {
		switch {
		case (m.Header == "") == (m.Cookie == ""):
			add("rollout.match", "exactly one of header and cookie is required")
		case m.Header != "" && !tokenRe.MatchString(m.Header):
			add("rollout.match.header", "not a valid header name")
		case m.Cookie != "" && !tokenRe.MatchString(m.Cookie):
			add("rollout.match.cookie", "not a valid cookie name")
		}
		if m.Value == "" {
			add("rollout.match.value", "required: the value that selects the new revision")
		}
	}
}

// imageRe accepts what an engine takes as a reference: an optional
// registry and path, a name, and a tag or a sha256 digest.
var imageIDRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

var imageRe = regexp.MustCompile(`^[a-z0-9]+([._/:-][a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$`)

// MemoryBytes parses a memory limit: bytes, or a number with a K, M, G or
// T suffix (powers of 1024; "Mi" and "MiB" spellings too).
func MemoryBytes(s string) (int64, error) {
	n, err := store.ParseByteSize(s)
	if err != nil {
		return 0, fmt.Errorf("memory %q: want bytes or a number with K, M, G or T", s)
	}
	return n, nil
}

// NormalizeHost returns the canonical spelling of a route host: IDNA to
// ASCII, lower case, no trailing dot. A leading "*." wildcard is kept.
func NormalizeHost(h string) (string, error) {
	h = strings.TrimSuffix(strings.TrimSpace(h), ".")
	if h == "" {
		return "", errors.New("empty host")
	}
	wild := strings.HasPrefix(h, "*.")
	rest := strings.TrimPrefix(h, "*.")
	if strings.Contains(rest, "*") {
		return "", fmt.Errorf("host %q: only a leading \"*.\" wildcard is allowed", h)
	}
	if strings.ContainsAny(rest, ":/ ") {
		return "", fmt.Errorf("host %q: a host name only, without port, scheme or path", h)
	}
	ascii, err := idna.Lookup.ToASCII(rest)
	if err != nil {
		return "", fmt.Errorf("host %q: %v", h, err)
	}
	ascii = strings.ToLower(ascii)
	if wild {
		ascii = "*." + ascii
	}
	return ascii, nil
}

// SpecHash is a stable hash of what an instance of a service runs: slots
// whose hash is unchanged keep their instances across deploys. The replica
// count and the routes are left out: they say how many instances there are
// and how traffic reaches them, not what one runs, so scaling a service or
// giving it a host restarts nothing; so are its locality, slow start and
// layer-4 entry points.
func SpecHash(s store.ServiceSpec) string {
	s.Replicas, s.Routes, s.Locality, s.SlowStart, s.Layer4 = nil, nil, nil, 0, store.Layer4{}
	b, _ := json.Marshal(s) // maps marshal with sorted keys
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Hash is a stable hash of a whole manifest.
func Hash(m *store.Manifest) string {
	b, _ := json.Marshal(m)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// ReadinessTimeout is the spec's readiness timeout with its default.
func ReadinessTimeout(s store.ServiceSpec) time.Duration {
	if t := time.Duration(s.Readiness.Timeout); t > 0 {
		return t
	}
	return DefaultReadiness
}

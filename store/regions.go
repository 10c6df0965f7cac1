package store

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Regions. A machine's region comes from its invite; gateways and DNS
// servers have one of their own. Routing prefers a service's instances in
// the reader's region (Locality), and each region has a state the operator
// sets (`control region`), published as a routing event so that every
// gateway and DNS server applies it with the routing change that carries
// it.

// Region states. A region no record names is active.
const (
	// RegionActive serves and takes new instances.
	RegionActive = "active"
	// RegionDraining keeps its instances but serves only when no other
	// region can, and takes no new instances.
	RegionDraining = "draining"
	// RegionDisabled is out of routing and placement.
	RegionDisabled = "disabled"
)

// regionRe is a region's name: one lower-case DNS label, as invites,
// manifests, gateways and DNS servers spell it.
var regionRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidRegion reports whether name is a region's name: one lower-case
// DNS label.
func ValidRegion(name string) bool { return regionRe.MatchString(name) }

// ValidRegionState reports whether s is a region state.
func ValidRegionState(s string) bool {
	return s == RegionActive || s == RegionDraining || s == RegionDisabled
}

// RegionRecord is the state an operator set for one region, carried by a
// region.upsert routing event on RoutingRegionSubject(Name).
type RegionRecord struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// By is who set the state (the CLI's user), for `control region ls`.
	By        string    `json:"by,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Locality policies: which of a service's instances a gateway in region R
// (and a DNS server there) serves from.
const (
	// LocalityPrefer serves R's instances while any can serve, else the
	// nearest other region's, else any region's. The default.
	LocalityPrefer = "prefer"
	// LocalityStrict serves R's instances only: none is a 503 that says
	// so.
	LocalityStrict = "strict"
	// LocalityAny serves every region's instances alike.
	LocalityAny = "any"
)

// Locality is a service's locality policy. Order, when set, is the order
// in which a reader falls back to other regions when its own cannot
// serve (regions it does not name come after, nearest first); without it
// the reader measures which is nearest.
type Locality struct {
	Policy string   `json:"policy,omitempty" yaml:"policy,omitempty"`
	Order  []string `json:"order,omitempty" yaml:"order,omitempty"`
}

// UnmarshalYAML takes the short form, a policy alone (`locality: strict`),
// as well as {policy, order}; a key it does not know is refused, as the
// manifest refuses unknown fields everywhere else.
func (l *Locality) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = Locality{Policy: n.Value}
		return nil
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i].Value; k != "policy" && k != "order" {
				return fmt.Errorf("line %d: locality has no field %q (want policy and order)", n.Content[i].Line, k)
			}
		}
	}
	type plain Locality
	return n.Decode((*plain)(l))
}

// UnmarshalJSON takes a policy alone as well as {policy, order}.
func (l *Locality) UnmarshalJSON(b []byte) error {
	var policy string
	if json.Unmarshal(b, &policy) == nil {
		*l = Locality{Policy: policy}
		return nil
	}
	type plain Locality
	return json.Unmarshal(b, (*plain)(l))
}

// PolicyOrDefault is l's policy with the default applied; a nil Locality
// is LocalityPrefer.
func (l *Locality) PolicyOrDefault() string {
	if l == nil || l.Policy == "" {
		return LocalityPrefer
	}
	return l.Policy
}

// ValidLocalityPolicy reports whether p is a locality policy ("" is the
// default).
func ValidLocalityPolicy(p string) bool {
	return p == "" || p == LocalityPrefer || p == LocalityStrict || p == LocalityAny
}

// ErrUnknownRegion is the error for a region no machine is in and no
// record names; it lists the regions that are known.
func ErrUnknownRegion(region string, known []string) *Error {
	return Errorf(CodeInvalid, "unknown region %q (known regions: %s)", region, regionList(known)).
		With("region", region)
}

func regionList(known []string) string {
	if len(known) == 0 {
		return "none: no machine has a region"
	}
	return strings.Join(known, ", ")
}

// regionOK checks a region event's body: a region named as regions are,
// and for an upsert, a state.
func (r *RoutingEvent) regionOK() error {
	if r.Region == nil || r.Region.Name == "" {
		return fmt.Errorf("%s event without a region", r.Kind)
	}
	if !ValidRegion(r.Region.Name) {
		return fmt.Errorf("%s event for region %q, not a valid name", r.Kind, r.Region.Name)
	}
	if r.Kind == EventRegionUpsert && !ValidRegionState(r.Region.State) {
		return fmt.Errorf("%s event for region %s with state %q (want %s, %s or %s)", r.Kind, r.Region.Name, r.Region.State,
			RegionActive, RegionDraining, RegionDisabled)
	}
	return nil
}

// RegionRecords reads the state set for each region, by name, each event
// verified under s's trust; one that does not verify is an error, as a
// state the reader cannot trust must not be taken for active.
func (s *Store) RegionRecords(ctx context.Context) (map[string]RegionRecord, error) {
	stream := s.Names.RoutingEventsStream()
	subjects, err := s.SubjectsOf(ctx, stream, s.Names.RoutingRegionSubject("*"))
	if err != nil {
		return nil, fmt.Errorf("reading region states: %w", err)
	}
	out := make(map[string]RegionRecord, len(subjects))
	err = s.LastOf(ctx, stream, subjects, func(m *StoredMsg) error {
		var ev RoutingEvent
		if err := s.VerifyEvent(ctx, m, &ev); err != nil {
			return err
		}
		if ev.Kind != EventRegionUpsert || ev.Region == nil {
			return Errorf(CodeInvalid, "routing event %d on %s is a %s, not a region state", m.Seq, m.Subject, ev.Kind)
		}
		out[ev.Region.Name] = *ev.Region
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading region states: %w", err)
	}
	return out, nil
}

// SetRegionState publishes r as its region's state, signed with s's
// signer key (the control plane's): every gateway and DNS server applies
// it with this routing event. It returns the event's sequence.
func (s *Store) SetRegionState(ctx context.Context, r RegionRecord) (uint64, error) {
	if r.UpdatedAt.IsZero() {
		r.UpdatedAt = time.Now().UTC()
	}
	return s.PublishRouting(ctx, "", []RoutingEvent{{Kind: EventRegionUpsert, Region: &r, At: r.UpdatedAt}})
}

// Package maintenance holds the control plane's rules for putting a
// namespace or one of its services under maintenance. The store carries
// the record (store.MaintenanceRecord, a signed routing event) and every
// gateway answers the routes it covers with a 503 page itself, touching
// no instance; the decisions others act on are made here:
//
//   - what may be put under maintenance (Check): a namespace with a live
//     deploy, and a service its live manifest names; anything else is
//     refused with not_found before anything is written;
//   - what an operator's change publishes (Set): one maintenance event,
//     signed with the CLI's signer; nothing when the record would change
//     nothing (off where nothing is on, on again with the same message
//     and Retry-After);
//   - when it may be published: never while a live gateway runs a
//     generation before store.GenerationEdge, which would refuse the event
//     as one it cannot read and keep proxying (version_skew);
//   - what `control maintenance ls` shows (List): every record, on or off,
//     who set it and when.
package maintenance

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/routing"
	"github.com/edgeplane/edgeplane/store"
)

// DefaultRetryAfter is the Retry-After a maintenance page gives when the
// operator names none.
const DefaultRetryAfter = time.Minute

// MaxMessage bounds a maintenance message: it is carried in a routing
// event every gateway keeps.
const MaxMessage = 4096

// Request is what an operator asks: Service "" is the whole namespace.
type Request struct {
	Namespace  string
	Service    string
	On         bool
	Message    string
	RetryAfter time.Duration
	// Wait, when > 0, bounds the wait for every live gateway to apply
	// the change.
	Wait time.Duration
}

// Change is what a maintenance change did.
type Change struct {
	Record store.MaintenanceRecord `json:"record"`
	// Previous is whether the namespace or service was under maintenance
	// before (its own record, else its namespace's); Changed is false
	// when the record would have changed nothing, and nothing was
	// published.
	Previous bool `json:"previous"`
	Changed  bool `json:"changed"`
	// Seq is the routing sequence of the event (0 when nothing was
	// published).
	Seq uint64 `json:"seq,omitempty"`
	// Gateways is, after a wait, how many live gateways applied Seq
	// ("2/3"); Laggards are those that had not when the wait ended.
	Gateways string   `json:"gateways,omitempty"`
	Laggards []string `json:"laggards,omitempty"`
}

// Check is nil when namespace has a live deploy and, when service is
// not "", its live manifest names service; else a not_found error that
// names what exists.
func Check(ctx context.Context, s *store.Store, namespace, service string) error {
	c, err := s.LiveCommit(ctx, namespace)
	if store.HasCode(err, store.CodeNotFound) || (err == nil && c.Destroy) {
		known, lerr := liveNamespaces(ctx, s)
		if lerr != nil {
			return lerr
		}
		return store.Errorf(store.CodeNotFound, "unknown namespace %q: no live deploy (namespaces: %s)", namespace, listOrNone(known)).
			With("namespace", namespace)
	}
	if err != nil {
		return err
	}
	if service == "" {
		return nil
	}
	if _, ok := c.Manifest.Services[service]; !ok {
		return store.Errorf(store.CodeNotFound, "namespace %s has no service %q (services: %s)", namespace, service,
			listOrNone(slices.Sorted(maps.Keys(c.Manifest.Services)))).With("namespace", namespace).With("service", service)
	}
	return nil
}

func liveNamespaces(ctx context.Context, s *store.Store) ([]string, error) {
	all, err := s.CommittedNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range all {
		if c, err := s.LiveCommit(ctx, ns); err == nil && !c.Destroy {
			out = append(out, ns)
		}
	}
	return out, nil
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// Effective is whether records put namespace's service under
// maintenance: its own record, else its namespace's (as the gateways'
// projection.View.Maintenance decides).
func Effective(records []store.MaintenanceRecord, namespace, service string) (store.MaintenanceRecord, bool) {
	var whole *store.MaintenanceRecord
	for i, r := range records {
		if r.Namespace != namespace {
			continue
		}
		if r.Service == service {
			return r, r.On
		}
		if r.Service == "" {
			whole = &records[i]
		}
	}
	if whole != nil {
		return *whole, whole.On
	}
	return store.MaintenanceRecord{}, false
}

// Set puts req's namespace or service under maintenance, or takes it
// out, as one signed routing event; with req.Wait > 0 it then waits, at
// most that long, for every live gateway to apply it. An unknown
// namespace or service is refused and nothing is published.
func Set(ctx context.Context, s *store.Store, req Request) (*Change, error) {
	if len(req.Message) > MaxMessage {
		return nil, store.Errorf(store.CodeInvalid, "the message is %d bytes; at most %d", len(req.Message), MaxMessage)
	}
	if req.RetryAfter < 0 {
		return nil, store.Errorf(store.CodeInvalid, "retry-after %s is negative", req.RetryAfter)
	}
	if err := Check(ctx, s, req.Namespace, req.Service); err != nil {
		return nil, err
	}
	records, err := s.MaintenanceRecords(ctx)
	if err != nil {
		return nil, err
	}
	rec := store.MaintenanceRecord{Namespace: req.Namespace, Service: req.Service, On: req.On}
	if req.On {
		rec.Message, rec.RetryAfter = req.Message, store.Duration(req.RetryAfter)
		if rec.RetryAfter == 0 {
			rec.RetryAfter = store.Duration(DefaultRetryAfter)
		}
	}
	ch := &Change{Record: rec}
	_, ch.Previous = Effective(records, req.Namespace, req.Service)
	if unchanged(records, rec, ch.Previous) {
		return ch, nil
	}
	if err := gatewaysReadMaintenance(ctx, s); err != nil {
		return nil, err
	}
	rec.By, rec.At = store.Operator(), time.Now().UTC()
	if ch.Seq, err = s.SetMaintenance(ctx, rec); err != nil {
		return nil, err
	}
	ch.Record, ch.Changed = rec, true
	if req.Wait > 0 {
		serving, total, laggards := routing.WaitApplied(ctx, s, ch.Seq, req.Wait)
		ch.Gateways, ch.Laggards = fmt.Sprintf("%d/%d", serving, total), laggards
	}
	return ch, nil
}

// unchanged reports whether publishing rec would change nothing: its own
// record says the same already, or it is an off where nothing is on and
// no record of its own could be overridden.
func unchanged(records []store.MaintenanceRecord, rec store.MaintenanceRecord, effective bool) bool {
	for _, r := range records {
		if r.Namespace == rec.Namespace && r.Service == rec.Service {
			return r.On == rec.On && r.Message == rec.Message && r.RetryAfter == rec.RetryAfter
		}
	}
	return !rec.On && !effective
}

// gatewaysReadMaintenance refuses to publish maintenance, with
// version_skew, while a live gateway announces a generation before edge
// protection: it would refuse the event as one it cannot read, and keep
// proxying to the instances.
func gatewaysReadMaintenance(ctx context.Context, s *store.Store) error {
	return routing.RefuseGatewaysBelow(ctx, s, store.GenerationEdge, "serve maintenance")
}

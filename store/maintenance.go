package store

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Maintenance as a routing event: a MaintenanceRecord (edge.go) on
// RoutingMaintenanceSubject, signed by the control plane like a region's
// state, so every gateway applies it with the routing change that
// carries it and a gateway that restarts finds it in the stored routing
// state. The last record of a subject is its truth; one with On false
// takes the namespace or service out of maintenance and stays, so a
// reader tells "taken out" from "never set".

// maintenanceOK checks a maintenance event's body: a namespace and an
// optional service named as routing subjects can carry them.
func (r *RoutingEvent) maintenanceOK() error {
	m := r.Maintenance
	if m == nil || m.Namespace == "" {
		return fmt.Errorf("%s event without a namespace", r.Kind)
	}
	if !ValidToken(m.Namespace) {
		return fmt.Errorf("%s event for namespace %q, not a valid name", r.Kind, m.Namespace)
	}
	if m.Service != "" && (!ValidToken(m.Service) || m.Service == maintenanceWhole) {
		return fmt.Errorf("%s event for service %q of %s, not a valid name", r.Kind, m.Service, m.Namespace)
	}
	return nil
}

// RoutingMaintenanceOf says which namespace and service (""  for the
// whole namespace) a routing subject carries the maintenance of, if it is
// a maintenance subject.
func (n Names) RoutingMaintenanceOf(subject string) (namespace, service string, ok bool) {
	rest, ok := strings.CutPrefix(subject, n.subjectPrefix()+".routing.maintenance.")
	if !ok {
		return "", "", false
	}
	namespace, service, ok = strings.Cut(rest, ".")
	if !ok || !ValidToken(namespace) || !ValidToken(service) {
		return "", "", false
	}
	if service == maintenanceWhole {
		service = ""
	}
	return namespace, service, true
}

// SortMaintenance sorts records by namespace, the whole namespace's
// first, then by service.
func SortMaintenance(recs []MaintenanceRecord) {
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].Namespace != recs[j].Namespace {
			return recs[i].Namespace < recs[j].Namespace
		}
		return recs[i].Service < recs[j].Service
	})
}

// MaintenanceRecords reads the last maintenance record of every
// namespace and service one was set for (on or off), sorted, each
// verified under s's trust; one that does not verify is an error, as a
// reader must not take a record it cannot trust for "not in maintenance".
func (s *Store) MaintenanceRecords(ctx context.Context) ([]MaintenanceRecord, error) {
	stream := s.Names.RoutingEventsStream()
	subjects, err := s.SubjectsOf(ctx, stream, s.Names.subjectPrefix()+".routing.maintenance.>")
	if err != nil {
		return nil, fmt.Errorf("reading maintenance records: %w", err)
	}
	out := make([]MaintenanceRecord, 0, len(subjects))
	err = s.LastOf(ctx, stream, subjects, func(m *StoredMsg) error {
		var ev RoutingEvent
		if err := s.VerifyEvent(ctx, m, &ev); err != nil {
			return err
		}
		if ev.Kind != EventMaintenanceUpsert || ev.Maintenance == nil {
			return Errorf(CodeInvalid, "routing event %d on %s is a %s, not a maintenance record", m.Seq, m.Subject, ev.Kind)
		}
		out = append(out, *ev.Maintenance)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading maintenance records: %w", err)
	}
	SortMaintenance(out)
	return out, nil
}

// SetMaintenance publishes rec, signed with s's signer key (the control
// plane's), as one routing event: every gateway applies it with that
// event. It returns the event's sequence.
func (s *Store) SetMaintenance(ctx context.Context, rec MaintenanceRecord) (uint64, error) {
	if rec.At.IsZero() {
		rec.At = time.Now().UTC()
	}
	return s.PublishRouting(ctx, "", []RoutingEvent{{Kind: EventMaintenanceUpsert, Maintenance: &rec, At: rec.At}})
}

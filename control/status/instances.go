package status

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/edgeplane/edgeplane/control/printers"
	"github.com/edgeplane/edgeplane/store"
)

// Instances is `control instances`: instance records, by namespace,
// service, slot and ID.
type Instances []store.InstanceRecord

// ReadInstances reads the instance records of namespace ns, or of every
// namespace when ns is "".
func ReadInstances(ctx context.Context, s *store.Store, ns string) (Instances, error) {
	filter := store.NamespaceInstancesFilter("*")
	if ns != "" {
		filter = store.NamespaceInstancesFilter(ns)
	}
	list := Instances{}
	err := s.ListInstances(ctx, filter, func(_ string, r *store.InstanceRecord) error {
		list = append(list, *r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Service != b.Service {
			return a.Service < b.Service
		}
		if a.Slot != b.Slot {
			return a.Slot < b.Slot
		}
		return a.ID < b.ID
	})
	return list, nil
}

// WriteText writes the records as a table.
func (list Instances) WriteText(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tSLOT\tINSTANCE\tREVISION\tMACHINE\tADDRESS\tSTATE\tRESTARTS\tLAST EXIT\tERROR")
	for _, r := range list {
		lastExit := "-"
		if r.LastExit != "" {
			lastExit = r.LastExit + " (" + r.LastExitAt.UTC().Format(time.RFC3339) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s:%d\t%s\t%d\t%s\t%s\n", r.Namespace, r.Service, r.Slot, r.ID, r.Revision,
			r.Machine, r.Address, r.Port, r.State, r.Restarts, lastExit, printers.Dash(r.Error))
	}
	tw.Flush()
}

// FindInstance finds an instance record by ID alone.
func FindInstance(ctx context.Context, s *store.Store, id string) (*store.InstanceRecord, error) {
	if !store.ValidToken(id) {
		return nil, store.Errorf(store.CodeInvalid, "instance id %q: letters, digits, '-' and '_' only", id)
	}
	var found *store.InstanceRecord
	err := s.ListInstances(ctx, "*.*."+id, func(_ string, r *store.InstanceRecord) error {
		found = r
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, store.Errorf(store.CodeNotFound, "no instance %s", id).With("instance", id)
	}
	return found, nil
}

package dashboard

import (
	"maps"
	"slices"
	"time"

	"github.com/edgeplane/edgeplane/control/fleet"
	"github.com/edgeplane/edgeplane/control/status"
	"github.com/edgeplane/edgeplane/store"
)

// Layer 4 on the pages: a namespace's entry points below HTTP (its live
// commit's), its connections beside its requests, and what the gateways
// report of its ports (those they could not open, the connections they
// let drain); the overview lists the same reports fleet-wide. The same
// reads as `control status`.

// l4Row is one service's entry points below HTTP.
type l4Row struct {
	Service string
	Entries []string
	Drain   time.Duration
}

// l4Rows lists the services of m that expose anything below HTTP.
func l4Rows(m *store.Manifest) []l4Row {
	var rows []l4Row
	for _, name := range slices.Sorted(maps.Keys(m.Services)) {
		l := m.Services[name].Layer4
		if l.Empty() {
			continue
		}
		rows = append(rows, l4Row{Service: name, Entries: status.EntryPoints(&l), Drain: l.Drain()})
	}
	return rows
}

// l4PortError is a port a gateway could not open.
type l4PortError struct {
	Gateway string
	store.L4PortError
}

// l4Drain is a gateway's connections to an instance that left routing;
// Late is set once its deadline passed.
type l4Drain struct {
	Gateway string
	store.L4Drain
	Late bool
}

// l4Shown bounds the port errors and drains a page lists.
const l4Shown = 50

// gatewayL4 gathers what gws report of layer 4, for namespace ns ("" for
// every namespace), at most l4Shown of each, and how many there are.
func gatewayL4(gws []fleet.Gateway, ns string, now time.Time) (errs []l4PortError, drains []l4Drain, nErrs, nDrains int) {
	for _, g := range gws {
		for _, e := range g.L4Errors {
			if ns != "" && e.Namespace != ns {
				continue
			}
			if nErrs++; len(errs) < l4Shown {
				errs = append(errs, l4PortError{Gateway: g.Gateway, L4PortError: e})
			}
		}
		for _, dr := range g.L4Draining {
			if ns != "" && dr.Namespace != ns {
				continue
			}
			if nDrains++; len(drains) < l4Shown {
				drains = append(drains, l4Drain{Gateway: g.Gateway, L4Drain: dr, Late: now.After(dr.Until)})
			}
		}
	}
	return errs, drains, nErrs, nDrains
}

// l4Reports is the layer-4 part of a page: what the gateways report.
type l4Reports struct {
	L4Errors    []l4PortError
	L4Draining  []l4Drain
	L4ErrorsAll int
	L4DrainsAll int
}

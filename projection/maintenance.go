package projection

import (
	"maps"
	"slices"

	"github.com/edgeplane/edgeplane/store"
)

// Maintenance. A namespace or a service under maintenance is answered by
// the gateway itself (a 503 page), its instances untouched: the view
// keeps the last record of each, on or off, as the routing stream holds
// it. A service's own record decides for it; without one, its
// namespace's does. So `maintenance off NS SVC` while NS is on takes the
// one service out, and a namespace's off does not end a service's own on.

// maintenanceKey is a record's key: a struct, so that a request's lookup
// builds no string.
type maintenanceKey struct{ namespace, service string }

// Maintenance returns the record that puts namespace's service under
// maintenance, if one does: the service's own record, else its
// namespace's, when it is on.
func (v *View) Maintenance(namespace, service string) (store.MaintenanceRecord, bool) {
	if len(v.maintenance) == 0 {
		return store.MaintenanceRecord{}, false
	}
	r, ok := v.maintenance[maintenanceKey{namespace, service}]
	if !ok {
		r, ok = v.maintenance[maintenanceKey{namespace, ""}]
	}
	return r, ok && r.On
}

// MaintenanceRecords lists the maintenance records of the view, on or
// off, sorted by namespace then service.
func (v *View) MaintenanceRecords() []store.MaintenanceRecord {
	out := slices.Collect(maps.Values(v.maintenance))
	store.SortMaintenance(out)
	return out
}

// upsertMaintenance sets a namespace's or service's maintenance record.
// Records are few: the map is copied on every change, never changed in
// place once in a view.
func (b *builder) upsertMaintenance(r store.MaintenanceRecord) {
	key := maintenanceKey{r.Namespace, r.Service}
	if old, ok := b.v.maintenance[key]; ok && old == r {
		return
	}
	b.v.maintenance = maps.Clone(b.v.maintenance)
	if b.v.maintenance == nil {
		b.v.maintenance = map[maintenanceKey]store.MaintenanceRecord{}
	}
	b.v.maintenance[key] = r
	b.changed = true
}

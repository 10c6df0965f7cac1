package projection

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// snapshotFormat is the version of the snapshot file layout. A reader
// refuses a newer one rather than guess.
const snapshotFormat = 1

// snapshotFile is the on-disk form of a View: the upserts and machines that
// rebuild it.
type snapshotFile struct {
	Format        int                   `json:"format"`
	Seq           uint64                `json:"seq"`
	StreamCreated time.Time             `json:"stream_created"`
	BuiltAt       time.Time             `json:"built_at"`
	SavedAt       time.Time             `json:"saved_at"`
	Services      []store.RoutingEvent  `json:"services"`
	Machines      []store.MachineRecord `json:"machines"`
	Regions       []store.RegionRecord  `json:"regions,omitempty"`
	// Maintenance are the maintenance records, on or off.
	Maintenance []store.MaintenanceRecord `json:"maintenance,omitempty"`
}

// writeSnapshot persists v to path atomically: a temp file in the same
// directory, synced, then renamed over the old snapshot. A crash leaves
// either the old or the new snapshot, never a torn one.
func writeSnapshot(path string, v *View) error {
	f := snapshotFile{Format: snapshotFormat, Seq: v.Seq, StreamCreated: v.StreamCreated,
		BuiltAt: v.BuiltAt, SavedAt: time.Now().UTC()}
	for _, s := range v.Services() {
		f.Services = append(f.Services, *s.event())
	}
	f.Machines = v.Machines()
	f.Regions = v.RegionRecords()
	f.Maintenance = v.MaintenanceRecords()
	data, err := json.Marshal(&f)
	if err != nil {
		return fmt.Errorf("encoding routing snapshot: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating snapshot directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating routing snapshot: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing routing snapshot %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing routing snapshot %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing routing snapshot %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replacing routing snapshot %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // make the rename durable where the platform allows
		d.Close()
	}
	return nil
}

// loadSnapshot reads the snapshot at path into a View marked stale. A
// missing file is an error satisfying errors.Is(err, os.ErrNotExist).
func loadSnapshot(path string) (*View, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f snapshotFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("reading routing snapshot %s: %w", path, err)
	}
	if f.Format == 0 || f.Format > snapshotFormat {
		return nil, fmt.Errorf("reading routing snapshot %s: format %d is not one this build reads (%d)", path, f.Format, snapshotFormat)
	}
	b := newBuilder(emptyView(true))
	for i := range f.Services {
		if err := b.apply(&f.Services[i]); err != nil {
			return nil, fmt.Errorf("reading routing snapshot %s: service %d: %w", path, i, err)
		}
	}
	for _, m := range f.Machines {
		if m.ID == "" {
			return nil, fmt.Errorf("reading routing snapshot %s: a machine without an ID", path)
		}
		b.upsertMachine(m)
	}
	for _, r := range f.Regions {
		if r.Name == "" {
			return nil, fmt.Errorf("reading routing snapshot %s: a region without a name", path)
		}
		b.upsertRegion(r)
	}
	for _, m := range f.Maintenance {
		if m.Namespace == "" {
			return nil, fmt.Errorf("reading routing snapshot %s: a maintenance record without a namespace", path)
		}
		b.upsertMaintenance(m)
	}
	v := b.finish(f.Seq, true)
	v.BuiltAt = f.BuiltAt
	v.StreamCreated = f.StreamCreated
	return v, nil
}

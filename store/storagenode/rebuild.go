package storagenode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"

	"github.com/edgeplane/edgeplane/store"
)

// QuarantineDir is where a clustered storage node keeps the copies of
// streams it found damaged as it started: DataDir/quarantine/<time>/, with
// damage.json saying what was found. The node rebuilt those streams from
// its peers; the directory is evidence to inspect, then delete (it holds
// the stream's data, encrypted when the store is).
const QuarantineDir = "quarantine"

// damageRecord is the damage.json of one quarantine.
type damageRecord struct {
	At     time.Time     `json:"at"`
	Damage []BlockDamage `json:"damage"`
}

// guardStore runs before the server opens the store of cfg.DataDir: a store
// with damaged blocks does not start with holes. A single box refuses,
// naming the files and the backup to restore; a node of a cluster moves
// the damaged streams' copies aside, so the server starts them empty and
// RAFT catches them up from the stream leader, as it catches up a new
// replica. A stream kept at one replica has no other copy: that refuses
// too.
func guardStore(cfg Config) error {
	damage, err := CheckStore(cfg.DataDir, cfg.StoreKey)
	if err != nil {
		return err
	}
	if len(damage) == 0 {
		return nil
	}
	if cfg.Cluster == nil {
		return damagedStoreError(cfg.DataDir, damage, "")
	}
	for _, d := range damage {
		if d.Replicas < 2 {
			return damagedStoreError(cfg.DataDir, damage, fmt.Sprintf(
				"stream %s has %s, so no other storage node holds a copy to rebuild it from", d.Stream, replicasText(d.Replicas)))
		}
	}
	return quarantine(cfg, damage)
}

func replicasText(n int) string {
	if n == 0 {
		return "a config this node cannot read"
	}
	return "one replica"
}

// damagedStoreError is the refusal to start: every damaged file by name,
// and what to do.
func damagedStoreError(dataDir string, damage []BlockDamage, why string) error {
	files := make([]string, 0, len(damage))
	streams := map[string]bool{}
	for _, d := range damage {
		files = append(files, d.String())
		streams[d.Stream] = true
	}
	names := make([]string, 0, len(streams))
	for s := range streams {
		names = append(names, s)
	}
	sort.Strings(names)
	if why != "" {
		why = "; " + why
	}
	return store.Errorf(store.CodeStoreDamaged, "refusing to start: the store in %s has a damaged block file: %s%s. "+
		"Starting would serve stream %s with holes. Restore your latest backup into a fresh data dir (`control storage restore FILE`, see the README, \"Backups\"), "+
		"and keep this data dir as it is to inspect",
		dataDir, strings.Join(files, "; "), why, strings.Join(names, ", ")).
		With("data", dataDir).With("file", damage[0].File).With("stream", strings.Join(names, ","))
}

// quarantine moves every damaged stream's directory into a new quarantine
// under DataDir, its damage.json written (and synced) first: a crash
// half-way leaves the stream in place and damaged, found again next start.
func quarantine(cfg Config, damage []BlockDamage) error {
	storeDir := filepath.Join(cfg.DataDir, "jetstream", server.JetStreamStoreDir)
	at := time.Now().UTC()
	dir := filepath.Join(cfg.DataDir, QuarantineDir, at.Format("20060102T150405.000000000Z"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("quarantining damaged streams: %w", err)
	}
	rec, _ := json.MarshalIndent(damageRecord{At: at, Damage: damage}, "", "  ")
	if err := writeSynced(filepath.Join(dir, "damage.json"), rec); err != nil {
		return fmt.Errorf("quarantining damaged streams: %w", err)
	}
	moved := map[string]bool{}
	for _, d := range damage {
		key := filepath.Join(d.Account, d.Stream)
		if moved[key] {
			continue
		}
		moved[key] = true
		from := filepath.Join(storeDir, d.Account, "streams", d.Stream)
		to := filepath.Join(dir, d.Account, d.Stream)
		if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
			return fmt.Errorf("quarantining stream %s: %w", d.Stream, err)
		}
		if err := os.Rename(from, to); err != nil {
			return fmt.Errorf("quarantining stream %s: %w", d.Stream, err)
		}
		if err := syncDir(filepath.Dir(from)); err != nil {
			return fmt.Errorf("quarantining stream %s: %w", d.Stream, err)
		}
		if cfg.Logger != nil {
			cfg.Logger.Warn("damaged stream copy moved aside; the stream leader catches this node up",
				zap.String("stream", d.Stream), zap.String("file", d.File), zap.String("problem", d.Problem), zap.String("quarantine", to))
		}
	}
	return nil
}

func writeSynced(file string, b []byte) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Rebuilt is a stream a storage node rebuilt from its peers, as its
// quarantine records it.
type Rebuilt struct {
	Stream string
	At     time.Time
	// Damage is what the node found in its copy.
	Damage string
}

// RebuiltStreams lists what the quarantines under dataDir record, latest
// last: every stream this node rebuilt from its peers since an operator
// last cleared DataDir/quarantine.
func RebuiltStreams(dataDir string) ([]Rebuilt, error) {
	if dataDir == "" {
		return nil, nil
	}
	dirs, err := os.ReadDir(filepath.Join(dataDir, QuarantineDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading quarantined streams: %w", err)
	}
	var out []Rebuilt
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(dataDir, QuarantineDir, d.Name(), "damage.json"))
		if err != nil {
			continue // a quarantine a crash interrupted: its stream stayed in place
		}
		var rec damageRecord
		if json.Unmarshal(b, &rec) != nil {
			continue
		}
		for _, dm := range rec.Damage {
			// Only a copy that was moved aside was rebuilt: a crash may
			// have come between the record and the move.
			if _, err := os.Stat(filepath.Join(dataDir, QuarantineDir, d.Name(), dm.Account, dm.Stream)); err != nil {
				continue
			}
			out = append(out, Rebuilt{Stream: dm.Stream, At: rec.At, Damage: dm.String()})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}

// dataDirOf is the data dir of a server Start started: its JetStream
// store is DataDir/jetstream/jetstream.
func dataDirOf(ns *server.Server) string {
	c := ns.JetStreamConfig()
	if c == nil || c.StoreDir == "" {
		return ""
	}
	return filepath.Dir(filepath.Dir(c.StoreDir))
}

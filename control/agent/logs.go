package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"sort"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Instance output. Instances write their output themselves (they outlive
// the agent), so a line carries no time of its own; to answer "since 10
// minutes ago" the agent samples each output's size once a second and
// keeps the samples where it changed, for the last logSampleWindow. A
// read since T starts at the size the output had at the last sample not
// after T: at most a second early, never late.

const (
	logSampleEvery  = time.Second
	logSampleWindow = time.Hour
)

// logSample is an output's size at a moment.
type logSample struct {
	at   time.Time
	size int64
}

// sampleLogs records the output sizes until the agent stops.
func (a *Agent) sampleLogs() {
	t := time.NewTicker(logSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-a.quit:
			return
		case <-t.C:
		}
		paths := a.logPaths()
		now := time.Now()
		for id, path := range paths {
			if path == "" {
				continue
			}
			fi, err := os.Stat(path)
			if err != nil {
				continue
			}
			a.noteLogSize(id, now, fi.Size())
		}
		a.dropLogSizes(paths)
	}
}

// logPaths is where each instance's output goes.
func (a *Agent) logPaths() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	paths := make(map[string]string, len(a.instances))
	for id, inst := range a.instances {
		paths[id] = inst.Runtime.LogPath
	}
	return paths
}

// dropLogSizes forgets the samples of instances no longer in keep.
func (a *Agent) dropLogSizes(keep map[string]string) {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	for id := range a.logSizes {
		if _, ok := keep[id]; !ok {
			delete(a.logSizes, id)
		}
	}
}

func (a *Agent) noteLogSize(id string, at time.Time, size int64) {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	ss := a.logSizes[id]
	if n := len(ss); n > 0 && ss[n-1].size == size {
		return
	}
	ss = append(ss, logSample{at, size})
	cut := 0
	for cut < len(ss)-1 && at.Sub(ss[cut].at) > logSampleWindow {
		cut++
	}
	a.logSizes[id] = ss[cut:]
}

// sinceOffset is where output written since t starts, as far as the
// samples tell: before the first of them, the whole output.
func (a *Agent) sinceOffset(id string, t time.Time) int64 {
	a.logMu.Lock()
	defer a.logMu.Unlock()
	ss := a.logSizes[id]
	i := sort.Search(len(ss), func(i int) bool { return ss[i].at.After(t) })
	if i == 0 {
		return 0 // before the first sample: from the start
	}
	return ss[i-1].size
}

// readLogs answers CmdLogs.
func (a *Agent) readLogs(_ context.Context, req store.LogsRequest) (*store.LogsReply, error) {
	inst, ok := a.lookup(req.InstanceID)
	if !ok {
		return nil, a.notHere(req.InstanceID)
	}
	var path string
	a.locked(func() { path = inst.Runtime.LogPath })
	if path == "" {
		return nil, store.Errorf(store.CodeNotFound, "instance %s keeps no output here", req.InstanceID).With("instance", req.InstanceID)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return &store.LogsReply{Data: []byte{}}, nil
	}
	if err != nil {
		return nil, store.Errorf(store.CodeInternal, "reading the output of %s: %w", req.InstanceID, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, store.Errorf(store.CodeInternal, "reading the output of %s: %w", req.InstanceID, err)
	}
	size := fi.Size()
	off := req.Offset
	switch {
	case off >= 0 && off <= size:
	case off > size:
		off = 0 // truncated since: all of what is there now
	case !req.Since.IsZero():
		off = a.sinceOffset(req.InstanceID, req.Since)
	default:
		off = max(0, size-store.MaxLogChunk)
	}
	buf := make([]byte, min(size-off, store.MaxLogChunk))
	n, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, store.Errorf(store.CodeInternal, "reading the output of %s at %d: %w", req.InstanceID, off, err)
	}
	return &store.LogsReply{Data: buf[:n], Offset: off, Next: off + int64(n), Size: size}, nil
}

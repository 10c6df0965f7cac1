package storagenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Snapshot is what SnapshotStream read besides the data: the stream's
// configuration and its state at the snapshot, which a restore needs.
type Snapshot struct {
	Config server.StreamConfig `json:"config"`
	State  server.StreamState  `json:"state"`
}

// SnapshotStream writes a point-in-time snapshot of stream (its messages,
// sequences, headers and durable consumers: JetStream's own snapshot, the
// tar.s2 the server makes) to w while writes to the stream go on. Each chunk
// is written before the server gets its flow-control ack, so a slow w slows
// the server's sending, nothing piles up. The stream is only read.
func SnapshotStream(ctx context.Context, nc *nats.Conn, stream string, w io.Writer) (*Snapshot, error) {
	deliver := nc.NewInbox()
	chunks, err := nc.SubscribeSync(deliver)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", stream, err)
	}
	defer chunks.Unsubscribe()
	// The server waits for this interest before sending.
	if err := nc.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", stream, err)
	}
	var snap server.JSApiStreamSnapshotResponse
	if err := jsAPI(ctx, nc, fmt.Sprintf(server.JSApiStreamSnapshotT, stream),
		server.JSApiStreamSnapshotRequest{DeliverSubject: deliver, ChunkSize: snapshotChunk}, &snap, &snap.ApiResponse); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", stream, err)
	}
	if snap.Config == nil || snap.State == nil {
		return nil, fmt.Errorf("snapshot %s: answer without config or state", stream)
	}
	for {
		m, err := chunks.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: waiting for data: %w", stream, err)
		}
		if len(m.Data) == 0 {
			// The end, with the snapshot's verdict as a status header.
			if st := m.Header.Get("Status"); st != "" && st != "204" {
				return nil, fmt.Errorf("snapshot %s failed: %s %s", stream, st, m.Header.Get("Description"))
			}
			return &Snapshot{Config: *snap.Config, State: *snap.State}, nil
		}
		if _, err := w.Write(m.Data); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", stream, err)
		}
		if m.Reply != "" {
			if err := m.Respond(nil); err != nil {
				return nil, fmt.Errorf("snapshot %s: %w", stream, err)
			}
		}
	}
}

// placementWait bounds how long a restore waits for a cluster to find
// peers with room for the stream.
const placementWait = 30 * time.Second

// startRestore asks the server to restore req's stream, and returns where
// the data goes. In a cluster, no peer has room for it until the peers
// told the meta leader their usage: just after they started, or just
// after a stream they held was deleted (its storage is counted free again
// at their next report); so "no suitable peers" is asked again, for up to
// placementWait.
func startRestore(ctx context.Context, nc *nats.Conn, req server.JSApiStreamRestoreRequest) (*server.JSApiStreamRestoreResponse, error) {
	for placed := time.Now().Add(placementWait); ; {
		var rest server.JSApiStreamRestoreResponse
		err := jsAPI(ctx, nc, fmt.Sprintf(server.JSApiStreamRestoreT, req.Config.Name), req, &rest, &rest.ApiResponse)
		if err == nil {
			return &rest, nil
		}
		var apiErr *server.ApiError
		if !errors.As(err, &apiErr) || apiErr.ErrCode != uint16(server.JSClusterNoPeersErrF) || time.Now().After(placed) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// RestoreStream creates snap's stream on the server behind nc from the
// snapshot data r holds, with replicas replicas and metadata added to its
// configuration's, and returns once the stream holds what the snapshot
// held and has a leader. The stream must not exist.
func RestoreStream(ctx context.Context, nc *nats.Conn, snap Snapshot, r io.Reader, replicas int, metadata map[string]string) (*StreamImport, error) {
	start := time.Now()
	stream := snap.Config.Name
	cfg := snap.Config
	cfg.Replicas = replicas
	if len(metadata) > 0 {
		cfg.Metadata = maps.Clone(cfg.Metadata)
		if cfg.Metadata == nil {
			cfg.Metadata = map[string]string{}
		}
		maps.Copy(cfg.Metadata, metadata)
	}
	rest, err := startRestore(ctx, nc, server.JSApiStreamRestoreRequest{Config: cfg, State: snap.State})
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", stream, err)
	}
	buf := make([]byte, snapshotChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := restoreChunk(ctx, nc, rest.DeliverSubject, buf[:n]); err != nil {
				return nil, fmt.Errorf("restore %s: %w", stream, err)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			// The server drops a restore that stops sending; nothing of
			// it is left as a stream.
			return nil, fmt.Errorf("restore %s: reading data: %w", stream, rerr)
		}
	}
	// The snapshot's state was read as it began, and its files block by
	// block after: writes in between may be in the data (never fewer).
	imp, err := endRestore(ctx, nc, stream, rest.DeliverSubject, replicas, start, func(st server.StreamState) error {
		if st.LastSeq < snap.State.LastSeq {
			return fmt.Errorf("restored up to sequence %d, the snapshot began at %d", st.LastSeq, snap.State.LastSeq)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", stream, err)
	}
	return imp, nil
}

// restoreChunk sends one chunk of snapshot data to the restore taking it
// at deliver, which acknowledges it before the next.
func restoreChunk(ctx context.Context, nc *nats.Conn, deliver string, data []byte) error {
	rep, err := restoreRequest(ctx, nc, deliver, data)
	if err != nil {
		return fmt.Errorf("sending data: %w", err)
	}
	if len(rep.Data) > 0 {
		var r server.ApiResponse
		if json.Unmarshal(rep.Data, &r) == nil && r.Error != nil {
			return fmt.Errorf("refused data: %w", r.Error)
		}
	}
	return nil
}

// endRestore ends the restore taking data at deliver (an empty message;
// the answer is the new stream), checks the restored state with check, and
// waits until the stream can be used: a replicated stream elects its
// leader after the restore answers, and a read before that fails.
func endRestore(ctx context.Context, nc *nats.Conn, stream, deliver string, replicas int, start time.Time, check func(server.StreamState) error) (*StreamImport, error) {
	var done server.JSApiStreamCreateResponse
	rep, err := restoreRequest(ctx, nc, deliver, nil)
	if err != nil {
		return nil, fmt.Errorf("finishing: %w", err)
	}
	if err := json.Unmarshal(rep.Data, &done); err != nil {
		return nil, fmt.Errorf("undecodable answer: %w", err)
	}
	if done.Error != nil {
		return nil, done.Error
	}
	if done.StreamInfo == nil {
		return nil, errors.New("answer without stream info")
	}
	st := done.StreamInfo.State
	if err := check(st); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	for {
		info, err := js.Stream(ctx, stream)
		if err == nil && settled(info.CachedInfo().Cluster, replicas) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("restored, but no leader before the deadline: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return &StreamImport{Stream: stream, Messages: st.Msgs, Bytes: st.Bytes, FirstSeq: st.FirstSeq, LastSeq: st.LastSeq,
		Replicas: done.StreamInfo.Config.Replicas, Took: time.Since(start)}, nil
}

package logs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/store"
)

// Access lines: what every gateway publishes of a service's requests
// (store.AccessLine, sampled under load), kept for an hour by the store's
// access-log stream. Tail with Access reads them from that stream, so a follow
// sees the lines of every gateway, live, without asking any of them.

// DefaultAccessSince is how far back access lines start without Since.
const DefaultAccessSince = 5 * time.Minute

// tailAccess writes o's access lines to w, oldest first.
func tailAccess(ctx context.Context, s *store.Store, w io.Writer, o Options) error {
	since := o.Since
	if since.IsZero() {
		since = time.Now().Add(-DefaultAccessSince)
	}
	cons, err := s.JS.OrderedConsumer(ctx, s.Names.AccessLogsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.Names.AccessWildcard(o.Namespace, o.Service)},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return fmt.Errorf("reading the access lines of %s/%s: %w", o.Namespace, o.Service, store.Classify(err))
	}
	pending := uint64(0)
	if !o.Follow {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("reading the access lines of %s/%s: %w", o.Namespace, o.Service, store.Classify(err))
		}
		pending = info.NumPending
	}
	for read := uint64(0); o.Follow || read < pending; read++ {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("reading the access lines of %s/%s: %w", o.Namespace, o.Service, store.Classify(err))
		}
		if err := printAccess(w, msg.Data(), o.Instance, o.JSON); err != nil {
			return err
		}
	}
	return nil
}

// printAccess writes one published line (of instance, when set): as it
// came, or as text.
func printAccess(w io.Writer, data []byte, instance string, raw bool) error {
	var l store.AccessLine
	if err := json.Unmarshal(data, &l); err != nil || (instance != "" && l.Instance != instance) {
		return nil // not a line this version reads, or not the instance's
	}
	if raw {
		_, err := fmt.Fprintf(w, "%s\n", data)
		return err
	}
	_, err := io.WriteString(w, FormatAccess(l)+"\n")
	return err
}

// FormatAccess is one access line as `control logs --access` prints it:
// time, gateway, status, method, host and path, duration, request ID,
// instance, and the share of requests sampled when it is less than all.
func FormatAccess(l store.AccessLine) string {
	target := l.Host + l.Path
	if l.Query != "" {
		target += "?" + l.Query
	}
	s := fmt.Sprintf("%s %s %d %s %s %s rid=%s", l.At.UTC().Format("2006-01-02T15:04:05.000Z"), l.Gateway, l.Status, l.Method,
		target, time.Duration(l.Duration*float64(time.Second)).Round(10*time.Microsecond), l.RequestID)
	if l.Instance != "" {
		s += " instance=" + l.Instance
	}
	if l.Sample > 0 && l.Sample < 1 {
		s += fmt.Sprintf(" sampled=%.3g", l.Sample)
	}
	return s
}

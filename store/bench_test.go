package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store/storetest"
)

// BenchmarkPublishRouting measures the control plane's side of routing:
// events signed and appended to the routing stream, in calls of 100 (a
// large deploy's commit), acknowledged before the next call.
func BenchmarkPublishRouting(b *testing.B) {
	srv := storetest.Start(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; done += 100 {
		if _, err := srv.Store.PublishRouting(ctx, "", upserts("bench", min(100, b.N-done))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

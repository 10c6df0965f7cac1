package store

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Only the meta leader's "peer offline" placement refusal is waited out;
// other refusals fail at once.
func TestPlacementPending(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, true},
		{fmt.Errorf("setting x: %w", &jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, insufficient storage"}, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10226, Description: "stream reconfiguration already in progress"}, false},
		{fmt.Errorf("plain"), false},
	} {
		if got := placementPending(tc.err); got != tc.want {
			t.Errorf("placementPending(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

package manifest

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Both spellings of locality parse into the same store.Locality, slow
// start with it; JSON takes the short form too (a stored spec is JSON).
func TestParseLocality(t *testing.T) {
	m, err := Parse([]byte(`
namespace: a
services:
  web: {command: [x], locality: strict}
  api: {command: [x], locality: {policy: prefer, order: [fra, ams]}, slow_start: 30s}
  db: {command: [x], locality: {order: [ams]}}
  any: {command: [x], locality: any}
`))
	if err != nil {
		t.Fatal(err)
	}
	if l := m.Services["web"].Locality; l == nil || l.Policy != store.LocalityStrict || len(l.Order) != 0 {
		t.Fatalf("web locality %+v", l)
	}
	api := m.Services["api"]
	if l := api.Locality; l == nil || l.Policy != store.LocalityPrefer || !slices.Equal(l.Order, []string{"fra", "ams"}) {
		t.Fatalf("api locality %+v", l)
	}
	if time.Duration(api.SlowStart) != 30*time.Second {
		t.Fatalf("api slow start %s", api.SlowStart)
	}
	if l := m.Services["db"].Locality; l.PolicyOrDefault() != store.LocalityPrefer || !slices.Equal(l.Order, []string{"ams"}) {
		t.Fatalf("db locality %+v", l)
	}
	var l store.Locality
	if err := json.Unmarshal([]byte(`"any"`), &l); err != nil || l.Policy != store.LocalityAny {
		t.Fatalf("json short form: %+v, %v", l, err)
	}
	b, _ := json.Marshal(api.Locality)
	var back store.Locality
	if err := json.Unmarshal(b, &back); err != nil || back.Policy != "prefer" || !slices.Equal(back.Order, api.Locality.Order) {
		t.Fatalf("json round trip of %s: %+v, %v", b, back, err)
	}
	got := Regions(m)
	want := map[string]string{"services.api.locality.order[0]": "fra", "services.api.locality.order[1]": "ams", "services.db.locality.order[0]": "ams"}
	if len(got) != len(want) {
		t.Fatalf("regions %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("regions %v, want %v", got, want)
		}
	}
}

func TestLocalityValidation(t *testing.T) {
	cases := []struct {
		name, svc string
		want      []string
	}{
		{"unknown policy", "locality: nearest", []string{`services.web.locality.policy: unknown policy "nearest": want prefer, strict or any`}},
		{"unknown policy long form", "locality: {policy: local}", []string{`services.web.locality.policy: unknown policy "local"`}},
		{"unknown key", "locality: {policy: prefer, regions: [fra]}", []string{"(syntax):", `locality has no field "regions"`}},
		{"region not a label", "locality: {order: [fra, Ams_1]}", []string{`services.web.locality.order[1]: region "Ams_1" is not a DNS label`}},
		{"repeated region", "locality: {order: [fra, ams, fra]}", []string{"services.web.locality.order[2]: region fra is already at order[0]"}},
		{"order with strict", "locality: {policy: strict, order: [fra]}", []string{"services.web.locality.order: an order applies to prefer only"}},
		{"order with any", "locality: {policy: any, order: [fra]}", []string{"services.web.locality.order: an order applies to prefer only"}},
		{"negative slow start", "slow_start: -1s", []string{"services.web.slow_start: must be between 0 (none) and 10m0s"}},
		{"huge slow start", "slow_start: 11m", []string{"services.web.slow_start: must be between"}},
		{"slow start not a duration", "slow_start: soon", []string{"(syntax):", "soon"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("namespace: a\nservices:\n  web:\n    command: [x]\n    " + tc.svc + "\n"))
			if err == nil {
				t.Fatal("accepted an invalid manifest")
			}
			me, ok := err.(*Error)
			if !ok {
				t.Fatalf("error type %T: %v", err, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if len(me.Problems) != 1 {
				t.Errorf("%d problems, want 1: %v", len(me.Problems), err)
			}
		})
	}
}

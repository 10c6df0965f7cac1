package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeplane/edgeplane/signing"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// 16. Control credentials without a signing key (stolen from a CI runner,
// say: they may publish on every subject) make no agent run, stop, drain
// or downgrade anything. Agent m1 refuses each request, unsigned as the
// thief must send it, with order_refused before acting: the command that
// would have written a marker never ran, shop's live instance still
// serves, and the commit stream is as it was. The CLI with those
// credentials and no --signing-key says it needs one.
func attackUnsignedAgentOrders(t *testing.T, f *attackFixture) {
	creds := filepath.Join(f.c.dir, "stolen-control.creds")
	f.c.mustControl("creds", "issue", "--role", storagenode.RoleControl, "--data", f.c.serverDir(), "-o", creds)
	th := f.as(t, creds)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := f.c.store.Names
	var live store.InstanceRecord
	for _, in := range f.c.instances("shop") {
		if in.Service == "web" && in.Machine == "m1" && f.webIDs[in.ID] {
			live = in
		}
	}
	if live.ID == "" {
		t.Fatal("no live web instance on m1")
	}
	marker := filepath.Join(f.c.dir, "ran-as-root")
	for _, c := range []struct {
		what, command string
		req           any
	}{
		{"start sh -c 'id > MARKER'", store.CmdStartCandidate, store.StartRequest{
			Instance: store.InstanceRecord{ID: "web-9-thief", Namespace: "shop", Service: "web", Slot: 9, Revision: 99, DeployID: "thief"},
			Spec:     store.ServiceSpec{Command: []string{"sh", "-c", "id > " + marker}}}},
		{"stop shop's live instance", store.CmdStopInstance, store.InstanceRequest{InstanceID: live.ID, Namespace: "shop", Forget: true}},
		{"drain shop's live instance", store.CmdDrainInstance, store.InstanceRequest{InstanceID: live.ID, Namespace: "shop"}},
		{"stop it as a leased command", store.CmdStop, store.LeasedCommand{InstanceID: live.ID, Namespace: "shop", Service: "web", Attempt: int(time.Now().UnixMilli())}},
		{"downgrade the agent", store.CmdUpgrade, store.UpgradeRequest{Release: "0.0.1", Attempt: int(time.Now().UnixMilli()), AllowDowngrade: true}},
	} {
		err := store.Call(ctx, th.nc, n.RPCSubject("m1", c.command), "m1", c.command, c.req, nil)
		if !store.HasCode(err, store.CodeOrderRefused) || store.AsError(err).Detail["reason"] != signing.ReasonUnsigned {
			t.Fatalf("control credentials without a key: %s: want order_refused (unsigned), got %v", c.what, err)
		}
		t.Logf("%s: refused: %v", c.what, err)
		// The store the thief holds has no key: it refuses before sending.
		if err := th.st.Call(ctx, "m1", c.command, c.req, nil); !store.HasCode(err, store.CodeSigningKeyRequired) {
			t.Fatalf("%s through a store without a signer: want signing_key_required, got %v", c.what, err)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the thief's command ran on m1: %v", err)
	}
	for _, in := range f.c.instances("shop") {
		if in.ID == "web-9-thief" {
			t.Fatalf("the thief's instance is recorded: %+v", in)
		}
		if in.ID == live.ID && in.State != store.InstanceReady {
			t.Fatalf("shop's live instance is %s", in.State)
		}
	}
	resp, err := http.Get(fmt.Sprintf("http://%s:%d/", live.Address, live.Port))
	if err != nil {
		t.Fatalf("shop's live instance stopped answering: %v", err)
	}
	resp.Body.Close()

	// The CLI with the stolen credentials and no signing key.
	_, stderr, code := runControl(t, []string{"EDGEPLANE_NATS=" + f.c.url, "EDGEPLANE_NATS_CREDS=" + creds, "EDGEPLANE_SIGNING_KEY="},
		"instance", "stop", live.ID)
	if code == 0 || !strings.Contains(stderr, store.CodeSigningKeyRequired) || !strings.Contains(stderr, "--signing-key") {
		t.Fatalf("control instance stop without a signing key: exit %d: %s", code, stderr)
	}
}

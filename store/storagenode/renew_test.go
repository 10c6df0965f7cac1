package storagenode_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// A box asks to renew its credentials on its own subject only: agent and
// mesh credentials of m1 on their role's m1 subject, a gateway on its own
// name's (gateway credentials always name one). The control plane is told which user
// key asked by the storage node, whatever the asker writes in its headers.
// Expired credentials connect nowhere, and say so.
func TestCredsRenewalSubjectsAreTheirOwn(t *testing.T) {
	dir, auth, ns := startWithAuth(t)
	names, _ := store.NewNames("", "")
	connect := func(creds string) *nats.Conn {
		t.Helper()
		nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: creds})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctl := connect(writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleControl}))
	// The control plane's side: every request that arrives, with who the
	// storage node says sent it.
	var mu sync.Mutex
	got := map[string]store.Requester{}
	sub, err := ctl.Subscribe(names.CredsSubject("*", "*", "*"), func(m *nats.Msg) {
		var who store.Requester
		_ = json.Unmarshal([]byte(m.Header.Get(store.RequesterHeader)), &who)
		mu.Lock()
		got[m.Subject] = who
		mu.Unlock()
		_ = m.Respond([]byte(`{}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = ctl.Flush()

	userOf := func(creds string) string {
		t.Helper()
		r, err := readUser(creds)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, c := range []struct {
		name    string
		req     storagenode.CredsRequest
		own     string
		refused []string
	}{
		{"agent m1", storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m1"},
			names.CredsSubject("renew", "agent", "m1"),
			[]string{names.CredsSubject("renew", "agent", "m2"), names.CredsSubject("renew", "mesh", "m1"), names.CredsSubject("renew", "gateway", "m1"),
				names.CredsSubject("retire", "agent", "m2")}},
		{"mesh m1", storagenode.CredsRequest{Role: storagenode.RoleMesh, Machine: "m1"},
			names.CredsSubject("renew", "mesh", "m1"),
			[]string{names.CredsSubject("renew", "mesh", "m2"), names.CredsSubject("renew", "agent", "m1")}},
		{"gateway gw1", storagenode.CredsRequest{Role: storagenode.RoleGateway, Machine: "gw1"},
			names.CredsSubject("renew", "gateway", "gw1"),
			[]string{names.CredsSubject("renew", "gateway", "gw2"), names.CredsSubject("renew", "agent", "gw1")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mu.Lock()
			clear(got)
			mu.Unlock()
			creds := writeCreds(t, auth, c.req)
			nc := connect(creds)
			violations := make(chan error, 16)
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err })
			if c.own != "" {
				// A header claiming another user is replaced by the
				// storage node's.
				msg := nats.NewMsg(c.own)
				msg.Header.Set(store.RequesterHeader, `{"acc":"`+auth.AccountPublicKey()+`","user":"UFORGED"}`)
				msg.Data = []byte(`{}`)
				if _, err := nc.RequestMsg(msg, 5*time.Second); err != nil {
					t.Fatalf("its own renewal subject: %v", err)
				}
				mu.Lock()
				who := got[c.own]
				mu.Unlock()
				if who.User != userOf(creds) || who.Account != auth.EdgeAccountPublicKey() {
					t.Fatalf("the control plane was told %+v, want user %s of the edge account", who, userOf(creds))
				}
			}
			for _, subj := range c.refused {
				_, err := nc.Request(subj, []byte(`{}`), 500*time.Millisecond)
				select {
				case v := <-violations:
					if !strings.Contains(v.Error(), "Permissions Violation") {
						t.Fatalf("%s: %v", subj, v)
					}
				case <-time.After(3 * time.Second):
					t.Fatalf("%s: no permissions violation (request: %v)", subj, err)
				}
				mu.Lock()
				_, arrived := got[subj]
				mu.Unlock()
				if arrived {
					t.Fatalf("%s reached the control plane", subj)
				}
			}
		})
	}

	// Expired credentials: refused before anything is sent, with what to
	// do; the server refuses them too (a client that sends them anyway).
	expired := writeCreds(t, auth, storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: "m9", TTL: time.Second})
	time.Sleep(2 * time.Second) // the JWT's expiry has one-second granularity
	_, err = store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: expired, Timeout: 2 * time.Second})
	if se := store.AsError(err); se == nil || se.Code != store.CodeUnauthorized || !strings.Contains(se.Message, "expired at") ||
		!strings.Contains(se.Message, "invited again") || se.Detail["machine"] != "m9" {
		t.Fatalf("connecting with expired credentials: %v", err)
	}
	bundle := filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(bundle, auth.TLS.BundlePEM, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(expired), nats.RootCAs(bundle), nats.TLSHandshakeFirst(), nats.Timeout(2*time.Second))
	if err == nil {
		nc.Close()
		t.Fatal("the server accepted expired credentials")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization") && !strings.Contains(strings.ToLower(err.Error()), "expired") {
		t.Fatalf("sending expired credentials anyway: %v, want an authorization error", err)
	}
}

func readUser(creds string) (string, error) {
	b, err := os.ReadFile(creds)
	if err != nil {
		return "", err
	}
	r, err := store.UserOfCreds(b)
	if err != nil {
		return "", err
	}
	return r.User, nil
}

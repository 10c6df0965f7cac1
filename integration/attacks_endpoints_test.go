package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storetest"
)

// 15. An agent's credentials write its own instance records, address
// included, and may ask for a republish; still, what gateways dial and
// DNS answers for its instances is the address the control plane
// admitted its machine at (m1: 127.0.0.1, the single box), with only the
// port the agent's. The agent points its instance at another loopback
// address, at cloud metadata (169.254.169.254) and at another member's
// address, each with a listener there ready to answer as "evil", and asks
// for a republish: the event the control plane signs names 127.0.0.1, the
// gateway keeps serving the real instance, DNS answers 127.0.0.1 only.
// Its admission "move" to any of those addresses is refused with the
// operator's command to use, and its machine record stays as it was; the
// operator's `control machine address` moves a machine.
func attackEndpointsFromAdmittedAddresses(t *testing.T, f *attackFixture) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	agent := f.as(t, f.agentCreds)
	before, err := machines.Get(ctx, f.c.store, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if before.Address != "127.0.0.1" {
		t.Fatalf("m1 is admitted at %s; this attack expects the single box on 127.0.0.1", before.Address)
	}
	// Another member, admitted by the operator's invite at another
	// loopback address (no agent runs it): the other machine m1 claims.
	token := strings.TrimSpace(f.c.mustControl("machine", "invite"))
	if _, err := machines.RequestAdmission(ctx, f.c.store, machines.AdmitJoin, machines.AdmissionRequest{Machine: "m15", Token: token, Address: "127.0.0.15"}); err != nil {
		t.Fatalf("admitting m15: %v", err)
	}
	defer f.c.mustControl("machine", "rm", "m15")

	var victim store.InstanceRecord
	for _, in := range f.c.instances("shop") {
		if f.webIDs[in.ID] {
			victim = in
		}
	}
	if victim.ID == "" || victim.Machine != "m1" {
		t.Fatalf("no instance of shop/web on m1: %+v", victim)
	}
	key := victim.Key()
	routing := storetest.Stream(t, f.c.store, f.c.store.Names.RoutingEventsStream())
	agentInstances := storetest.Bucket(t, agent.st, agent.st.Names.InstancesBucket())
	for _, addr := range []string{"127.0.0.2", "::1", "169.254.169.254", "127.0.0.15"} {
		// Where the agent points, something answers as the thief's
		// (where the address can be listened on here).
		evilListen(t, addr, victim.Port)
		ent, err := agentInstances.Get(ctx, key)
		if err != nil {
			t.Fatalf("the agent reading its own instance record: %v", err)
		}
		var rec store.InstanceRecord
		if err := json.Unmarshal(ent.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		// Ready, as the agent may say: only where it is reached is
		// not its to say.
		rec.Address, rec.State, rec.Error, rec.UpdatedAt = addr, store.InstanceReady, "", time.Now().UTC()
		data, _ := json.Marshal(&rec)
		if _, err := agentInstances.Put(ctx, key, data); err != nil {
			t.Fatalf("the agent writing its own instance record: %v", err)
		}
		seq, err := agent.st.RequestRepublish(ctx, "m1", "shop", "web")
		if err != nil {
			t.Fatalf("republish request: %v", err)
		}
		msg, err := routing.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var ev store.RoutingEvent
		if err := store.Decode("routing event", msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if len(ev.Endpoints) != len(f.webIDs) {
			t.Fatalf("instance record at %s: the control plane signed %d endpoints, want %d", addr, len(ev.Endpoints), len(f.webIDs))
		}
		for _, ep := range ev.Endpoints {
			if ep.Address != before.Address {
				t.Fatalf("instance record at %s: the control plane signed endpoint %+v", addr, ep)
			}
		}
		eventually(t, 10*time.Second, "the gateway to apply the republished event", func() bool {
			st, err := f.gw.projectionFull()
			return err == nil && st.AppliedSeq >= seq
		})
		for range 10 {
			code, inst, err := f.gw.request("shop.example.com", "/")
			if err != nil || code != 200 || !f.webIDs[inst] {
				t.Fatalf("instance record at %s: gateway answered %d %q %v, want one of %v", addr, code, inst, err, f.webIDs)
			}
		}
		if got := dnsA(t, f.dns, "web.shop.edgeplane.internal."); strings.Join(got, ",") != before.Address {
			t.Fatalf("instance record at %s: DNS answers %v, want %s only", addr, got, before.Address)
		}
		if got := dnsA(t, f.dns, victim.ID+".web.shop.edgeplane.internal."); strings.Join(got, ",") != before.Address {
			t.Fatalf("instance record at %s: DNS answers %v for the instance, want %s", addr, got, before.Address)
		}
		if st, _ := f.gw.projectionFull(); st.Endpoints.SetAside != 0 {
			t.Fatalf("the gateway sets aside %d endpoints of what the control plane signed: %+v", st.Endpoints.SetAside, st.Endpoints)
		}
	}
	// The record as its agent wrote it, for what follows.
	data, _ := json.Marshal(&victim)
	instances := storetest.Bucket(t, f.c.store, f.c.store.Names.InstancesBucket())
	if _, err := instances.Put(ctx, key, data); err != nil {
		t.Fatal(err)
	}

	// Admission: the agent may move its machine to its mesh IP only (it
	// has none here); any other move is the operator's.
	for _, addr := range []string{"127.0.0.2", "127.0.0.15", "203.0.113.66", "169.254.169.254", "0.0.0.0", "224.0.0.1"} {
		_, err := machines.RequestAdmission(ctx, agent.st, machines.AdmitAddress, machines.AdmissionRequest{Machine: "m1", Address: addr})
		if !store.HasCode(err, store.CodeInvalid) {
			t.Fatalf("agent m1 moving itself to %s: %v, want invalid", addr, err)
		}
		if store.SpecialAddress(netipOf(t, addr)) == "" && !strings.Contains(err.Error(), "control machine address m1 "+addr) {
			t.Fatalf("the refusal does not name the operator's command: %v", err)
		}
		t.Logf("agent m1 moving itself to %s: refused (%v)", addr, err)
	}
	after, err := machines.Get(ctx, f.c.store, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if after.Address != before.Address || !after.UpdatedAt.Equal(before.UpdatedAt) {
		t.Fatalf("m1's record changed: %+v, was %+v", after, before)
	}
	// The operator moves a machine.
	out := f.c.mustControl("machine", "address", "m15", "127.0.0.16")
	if m15, err := machines.Get(ctx, f.c.store, "m15"); err != nil || m15.Address != "127.0.0.16" || !strings.Contains(out, "moved from 127.0.0.15 to 127.0.0.16") {
		t.Fatalf("the operator's move: %q, %+v %v", out, m15, err)
	}
}

// evilListen answers every request at addr:port as the thief's instance
// "evil" until the test ends; an address that cannot be listened on here
// (no interface has it, or the port is taken) is skipped.
func evilListen(t *testing.T, addr string, port int) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
	if err != nil {
		t.Logf("no listener at %s:%d (%v)", addr, port, err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"instance":"evil"}`))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// dnsA returns the A and AAAA answers for name.
func dnsA(t *testing.T, server, name string) []string {
	t.Helper()
	var out []string
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m := new(dns.Msg)
		m.SetQuestion(name, qt)
		r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, server)
		if err != nil {
			t.Fatalf("DNS %s: %v", name, err)
		}
		for _, rr := range r.Answer {
			switch a := rr.(type) {
			case *dns.A:
				out = append(out, a.A.String())
			case *dns.AAAA:
				out = append(out, a.AAAA.String())
			}
		}
	}
	return out
}

func netipOf(t *testing.T, addr string) netip.Addr {
	t.Helper()
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	return ip
}

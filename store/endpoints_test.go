package store_test

import (
	"testing"

	"github.com/edgeplane/edgeplane/store"
)

// A reader dials an endpoint only at its machine's admitted address: a
// loopback, link-local, unspecified or multicast address only when the
// machine was admitted at that very address (the single box on
// 127.0.0.1), and never another machine's address.
func TestCheckEndpoint(t *testing.T) {
	m1 := &store.MachineRecord{ID: "m1", Address: "10.100.0.1"}
	m2 := &store.MachineRecord{ID: "m2", Address: "10.100.0.2"}
	box := &store.MachineRecord{ID: "box", Address: "127.0.0.1"}
	v6 := &store.MachineRecord{ID: "v6", Address: "fd00::1"}
	for _, tc := range []struct {
		name    string
		machine *store.MachineRecord
		addr    string
		port    int
		reason  string // "" when dialled
	}{
		{"its own admitted address", m1, "10.100.0.1", 8080, ""},
		{"its own address, v4-mapped", m1, "::ffff:10.100.0.1", 8080, ""},
		{"its own v6 address", v6, "fd00::1", 8080, ""},
		{"the single box on loopback", box, "127.0.0.1", 8080, ""},
		{"another machine's address", m1, m2.Address, 8080, store.EndpointNotAdmitted},
		{"a public address", m1, "203.0.113.9", 80, store.EndpointNotAdmitted},
		{"loopback", m1, "127.0.0.1", 18191, store.EndpointSpecialAddress},
		{"another loopback address on the single box", box, "127.0.0.2", 8080, store.EndpointSpecialAddress},
		{"v6 loopback", m1, "::1", 8080, store.EndpointSpecialAddress},
		{"link-local: cloud metadata", m1, "169.254.169.254", 80, store.EndpointSpecialAddress},
		{"link-local v6", m1, "fe80::1", 80, store.EndpointSpecialAddress},
		{"link-local v6 with a zone", m1, "fe80::1%eth0", 80, store.EndpointBadAddress},
		{"unspecified", m1, "0.0.0.0", 8080, store.EndpointSpecialAddress},
		{"unspecified v6", m1, "::", 8080, store.EndpointSpecialAddress},
		{"multicast", m1, "224.0.0.1", 8080, store.EndpointSpecialAddress},
		{"multicast v6", m1, "ff02::1", 8080, store.EndpointSpecialAddress},
		{"a machine the reader does not hold", nil, "10.100.0.1", 8080, store.EndpointUnknownMachine},
		{"not an IP address", m1, "metadata.google.internal", 80, store.EndpointBadAddress},
		{"no port", m1, "10.100.0.1", 0, store.EndpointBadAddress},
		{"a port past 65535", m1, "10.100.0.1", 70000, store.EndpointBadAddress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "m1"
			if tc.machine != nil {
				id = tc.machine.ID
			}
			ep := store.Endpoint{InstanceID: "i1", Machine: id, Address: tc.addr, Port: tc.port}
			err := store.CheckEndpoint(&ep, tc.machine)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason != "" && (!store.HasCode(err, store.CodeInvalid) || store.AsError(err).Detail["reason"] != tc.reason):
				t.Fatalf("got %v, want a refusal for %s", err, tc.reason)
			}
		})
	}
	// A record filed for another machine admits nothing of this one.
	if err := store.CheckEndpoint(&store.Endpoint{InstanceID: "i1", Machine: "m1", Address: m2.Address, Port: 80}, m2); err == nil {
		t.Fatal("m2's record admitted an endpoint of m1")
	}
}

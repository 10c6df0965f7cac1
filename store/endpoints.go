package store

import (
	"fmt"
	"net/netip"
)

// Endpoint addresses. An endpoint is where gateways and DNS send a
// service's traffic, so what an untrusted role reports must never decide
// it: the control plane derives an endpoint's IP from its machine's
// admitted address (MachineRecord.Address, which admission or an operator
// wrote) and takes only the port from the agent's instance record
// (control/routing). Every reader checks each endpoint of a signed routing
// event against the machine record it holds before dialling it
// (CheckEndpoint), so a routing event derived some other way (an older
// control plane, a bug) cannot point a gateway at its own loopback, at
// cloud metadata, or at another machine either.

// Reasons a reader refuses an endpoint: the "reason" detail of
// CheckEndpoint's error.
const (
	// EndpointUnknownMachine: the reader holds no record of the machine
	// the endpoint names.
	EndpointUnknownMachine = "unknown_machine"
	// EndpointSpecialAddress: a loopback, link-local, unspecified or
	// multicast address its machine was not admitted at.
	EndpointSpecialAddress = "special_address"
	// EndpointNotAdmitted: an address other than its machine's admitted
	// one.
	EndpointNotAdmitted = "not_admitted"
	// EndpointBadAddress: not an IP address, or no port.
	EndpointBadAddress = "bad_address"
)

// SpecialAddress names the class of ip that no endpoint may have unless
// its machine was admitted at that very address: "loopback" (the
// gateway's own box), "link-local" (cloud metadata at 169.254.169.254, a
// link's neighbours), "unspecified" and "multicast"; "" for any other.
func SpecialAddress(ip netip.Addr) string {
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		return "loopback"
	case ip.IsLinkLocalUnicast():
		return "link-local"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsMulticast():
		return "multicast"
	}
	return ""
}

// CheckEndpoint reports whether a reader may dial ep, given m, the record
// of the machine ep names as the reader holds it (nil when it holds
// none): only at m's admitted address, and with a port. So a loopback
// endpoint is dialled only on a machine admitted at that loopback address
// (the single box on 127.0.0.1), and never one at another machine's
// address. A refusal is an invalid *Error whose "reason" detail is one of
// the Endpoint* reasons above.
func CheckEndpoint(ep *Endpoint, m *MachineRecord) error {
	refuse := func(reason, format string, args ...any) error {
		return Errorf(CodeInvalid, "endpoint %s of instance %s on machine %s: %s", endpointAddr(ep), ep.InstanceID, ep.Machine, fmt.Sprintf(format, args...)).
			With("reason", reason).With("machine", ep.Machine).With("instance", ep.InstanceID).With("address", ep.Address)
	}
	ip, err := netip.ParseAddr(ep.Address)
	if err != nil || ip.Zone() != "" || ep.Port <= 0 || ep.Port > 65535 {
		return refuse(EndpointBadAddress, "not an IP address and port")
	}
	ip = ip.Unmap()
	if m == nil || m.ID != ep.Machine {
		return refuse(EndpointUnknownMachine, "no record of machine %s", ep.Machine)
	}
	admitted, err := netip.ParseAddr(m.Address)
	admittedHere := err == nil && admitted.Unmap() == ip
	if class := SpecialAddress(ip); class != "" && !admittedHere {
		return refuse(EndpointSpecialAddress, "%s, and machine %s was admitted at %s", class, m.ID, m.Address)
	}
	if !admittedHere {
		return refuse(EndpointNotAdmitted, "machine %s was admitted at %s", m.ID, m.Address)
	}
	return nil
}

func endpointAddr(ep *Endpoint) string {
	if ip, err := netip.ParseAddr(ep.Address); err == nil {
		return netip.AddrPortFrom(ip, uint16(max(0, min(ep.Port, 65535)))).String()
	}
	return fmt.Sprintf("%q:%d", ep.Address, ep.Port)
}

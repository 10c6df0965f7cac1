package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// Modes of the WireGuard device.
const (
	ModeTUN      = "tun"      // kernel TUN interface (needs /dev/net/tun and CAP_NET_ADMIN)
	ModeNetstack = "netstack" // userspace TCP/IP stack inside the process
)

// DefaultListenPort is WireGuard's customary port.
const DefaultListenPort = 51820

// JoinOptions are `meshd join`'s inputs.
type JoinOptions struct {
	Token   string
	DataDir string
	NATSURL string
	// CredsFile holds NATS credentials for this machine (mesh role); the
	// state keeps its absolute path for run and leave. Needed when the
	// control plane listens beyond loopback.
	CredsFile string
	// CAFile, if set, is a PEM bundle of the CAs storage nodes are
	// verified against besides the one the credentials carry; saved.
	CAFile string
	// TrustRoot is the key peer records must be signed under; saved for
	// run. Default: the root the credentials carry, else the store's,
	// pinned on first contact.
	TrustRoot string
	// Installation and Authority scope the registrar subject; defaults
	// local/default.
	Installation, Authority string
	// Machine defaults to the host name.
	Machine string
	// ListenPort for WireGuard; 0 picks a free port now and keeps it.
	ListenPort int
	// Bind is the local address to listen on; "" means every address.
	Bind string
	// Advertise lists ip:port addresses peers can reach the WireGuard port
	// at besides the node's own (a port forward on its router); they are
	// advertised first.
	Advertise []string
	Mode      string
	// Interface is the TUN interface name; default "mesh0".
	Interface string
	Timeout   time.Duration
}

func (o *JoinOptions) validate() error {
	if o.Token == "" {
		return fmt.Errorf("--token is required (the output of `control machine invite`)")
	}
	if !strings.HasPrefix(o.Token, store.InviteTokenPrefix) {
		return fmt.Errorf("--token: not an edgeplane invite token (want %s...)", store.InviteTokenPrefix)
	}
	if o.DataDir == "" {
		return fmt.Errorf("--data is required")
	}
	if o.Machine == "" {
		o.Machine = store.DefaultMachineID()
	}
	if !store.ValidToken(o.Machine) {
		return fmt.Errorf("--machine %q: letters, digits, '-' and '_' only", o.Machine)
	}
	if o.Mode == "" {
		o.Mode = ModeTUN
	}
	if o.Mode != ModeTUN && o.Mode != ModeNetstack {
		return fmt.Errorf("--mode %q: want tun or netstack", o.Mode)
	}
	if o.ListenPort < 0 || o.ListenPort > 65535 {
		return fmt.Errorf("--listen-port %d: out of range", o.ListenPort)
	}
	if o.Bind != "" {
		if _, err := netip.ParseAddr(o.Bind); err != nil {
			return fmt.Errorf("--bind %q: want an IP address", o.Bind)
		}
	}
	if o.Interface == "" {
		o.Interface = "mesh0"
	}
	if len(o.Interface) > 15 {
		return fmt.Errorf("--interface %q: at most 15 characters", o.Interface)
	}
	creds, err := checkCreds(o.CredsFile)
	if err != nil {
		return err
	}
	o.CredsFile = creds
	if o.CAFile != "" {
		if o.CAFile, err = filepath.Abs(o.CAFile); err != nil {
			return err
		}
	}
	return nil
}

// Join registers this node with the registrar and persists its membership
// in the data dir. Joining again with the same data dir (and an invite the
// same machine redeemed) keeps the node's key and mesh IP. A join that
// fails writes nothing: a new key is saved only once the registrar has
// accepted it.
func Join(ctx context.Context, o JoinOptions) (*State, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if prev, err := LoadState(o.DataDir); err == nil && prev.Machine != o.Machine {
		return nil, fmt.Errorf("data dir %s belongs to machine %s; leave first or use another --data", o.DataDir, prev.Machine)
	}
	key, found, err := loadKey(o.DataDir, keyFile)
	if err != nil {
		return nil, err
	}
	if !found {
		if key, err = newKey(); err != nil {
			return nil, err
		}
	}
	if o.ListenPort == 0 {
		if o.ListenPort, err = freeUDPPort(o.Bind); err != nil {
			return nil, err
		}
	}
	names, err := store.NewNames(o.Installation, o.Authority)
	if err != nil {
		return nil, err
	}
	if o.NATSURL == "" {
		o.NATSURL = store.URLFromEnv()
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	nc, err := store.Connect(store.ConnectOptions{URL: o.NATSURL, CredsFile: o.CredsFile, CAFile: o.CAFile, Name: "meshd join " + o.Machine, Timeout: timeout})
	if err != nil {
		return nil, connectErr(err, o.CredsFile)
	}
	defer nc.Close()
	eps, err := LocalEndpoints(o.Bind, o.ListenPort)
	if err != nil {
		return nil, err
	}
	eps = append(append([]string(nil), o.Advertise...), eps...)
	req := store.MeshRegisterRequest{
		Version: store.RecordVersion, Token: o.Token, Machine: o.Machine, PublicKey: key.Public().String(),
		Endpoints: eps,
		Capabilities: map[string]string{
			"mode": o.Mode, "tun": fmt.Sprint(tunAvailable()), "netstack": "true",
			"os": runtime.GOOS + "/" + runtime.GOARCH, "stun_demux": "true",
			store.MeshCapPSK: "v1",
		},
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rep store.MeshRegisterReply
	if err := callRegistrar(cctx, nc, names, "register", o.Machine, o.CredsFile, req, &rep); err != nil {
		if store.HasCode(err, store.CodeRPCFailure) {
			return nil, fmt.Errorf("registering with the mesh registrar: %w (is `control server` running with the registrar?)", err)
		}
		return nil, fmt.Errorf("registering with the mesh registrar: %w", err)
	}
	if !found {
		if err := saveKey(o.DataDir, keyFile, key); err != nil {
			return nil, err
		}
	}
	// The registrar now holds keyFile's key: a rotation left half done
	// before this join is void.
	if err := os.Remove(filepath.Join(o.DataDir, nextKeyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	st := &State{
		Version: store.RecordVersion, Machine: rep.Machine, MeshIP: rep.MeshIP, Subnet: rep.Subnet,
		Secret: rep.Secret, NATSURL: o.NATSURL, CredsFile: o.CredsFile, CAFile: o.CAFile, TrustRoot: o.TrustRoot, Installation: names.Installation, Authority: names.Authority,
		STUN: rep.STUN, ListenPort: o.ListenPort, Bind: o.Bind, Mode: o.Mode, Interface: o.Interface,
		JoinedAt: time.Now().UTC(),
	}
	if err := SaveState(o.DataDir, st); err != nil {
		return nil, err
	}
	return st, nil
}

// LocalEndpoints lists ip:port addresses peers can try: the bound address,
// or every up, non-loopback interface address (loopback when that is all
// there is).
func LocalEndpoints(bind string, port int) ([]string, error) {
	if bind != "" {
		a, err := netip.ParseAddr(bind)
		if err != nil {
			return nil, fmt.Errorf("bind %q: %w", bind, err)
		}
		if !a.IsUnspecified() {
			return []string{netip.AddrPortFrom(a, uint16(port)).String()}, nil
		}
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	var out []string
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagPointToPoint != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			p, err := netip.ParsePrefix(a.String())
			if err != nil || p.Addr().IsLinkLocalUnicast() || inMesh(p.Addr()) {
				continue
			}
			out = append(out, netip.AddrPortFrom(p.Addr(), uint16(port)).String())
			if len(out) == 8 {
				return out, nil
			}
		}
	}
	if len(out) == 0 {
		out = append(out, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)).String())
	}
	return out, nil
}

var meshPrefix = netip.MustParsePrefix(store.MeshSubnet)

func inMesh(a netip.Addr) bool { return meshPrefix.Contains(a) }

func freeUDPPort(bind string) (int, error) {
	addr := "0.0.0.0:0"
	if bind != "" {
		addr = net.JoinHostPort(bind, "0")
	}
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return 0, fmt.Errorf("choosing a listen port: %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

func tunAvailable() bool {
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

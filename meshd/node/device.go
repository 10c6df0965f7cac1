package node

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/edgeplane/edgeplane/meshd/wgbind"
)

// MTU of the mesh interface: 1500 minus WireGuard's IPv4/UDP overhead.
const MTU = 1420

// PersistentKeepalive keeps NAT mappings open and brings tunnels up
// proactively.
const PersistentKeepalive = 25

// wg is the WireGuard device and its interface.
type wg struct {
	dev   *device.Device
	tun   tun.Device
	net   *netstack.Net // netstack mode only
	demux *wgbind.Demux
	iface string
	port  int
}

func openDevice(st *State, key Key, logf func(string, ...any)) (*wg, error) {
	meshIP, err := netip.ParseAddr(st.MeshIP)
	if err != nil {
		return nil, fmt.Errorf("mesh ip %q in state: %w", st.MeshIP, err)
	}
	w := &wg{port: st.ListenPort}
	switch st.Mode {
	case ModeNetstack:
		t, n, err := netstack.CreateNetTUN([]netip.Addr{meshIP}, nil, MTU)
		if err != nil {
			return nil, fmt.Errorf("creating netstack device: %w", err)
		}
		w.tun, w.net, w.iface = t, n, "netstack"
	case ModeTUN, "":
		name := st.Interface
		if name == "" {
			name = "mesh0"
		}
		t, err := tun.CreateTUN(name, MTU)
		if err != nil {
			return nil, fmt.Errorf("creating TUN interface %s (needs /dev/net/tun and CAP_NET_ADMIN; --mode netstack works without): %w", name, err)
		}
		if real, err := t.Name(); err == nil {
			name = real
		}
		w.tun, w.iface = t, name
	default:
		return nil, fmt.Errorf("mode %q: want tun or netstack", st.Mode)
	}
	var inner conn.Bind
	if st.Bind != "" {
		a, err := netip.ParseAddr(st.Bind)
		if err != nil {
			w.tun.Close()
			return nil, fmt.Errorf("bind %q: %w", st.Bind, err)
		}
		inner = wgbind.NewAddrBind(a)
	} else {
		// wireguard-go's own bind: batched I/O with UDP GSO/GRO and socket
		// buffers raised past rmem_max.
		inner = conn.NewStdNetBind()
	}
	w.demux = wgbind.NewDemux(inner)
	logger := &device.Logger{Verbosef: device.DiscardLogf, Errorf: logf}
	w.dev = device.NewDevice(w.tun, w.demux, logger)
	cfg := fmt.Sprintf("private_key=%s\nlisten_port=%d\n", key.Hex(), st.ListenPort)
	if err := w.dev.IpcSet(cfg); err != nil {
		w.dev.Close()
		return nil, fmt.Errorf("configuring device: %w", err)
	}
	if err := w.dev.Up(); err != nil {
		w.dev.Close()
		return nil, fmt.Errorf("bringing device up (port %d in use?): %w", st.ListenPort, err)
	}
	if st.Mode != ModeNetstack {
		prefix := meshPrefix.Bits()
		if p, err := netip.ParsePrefix(st.Subnet); err == nil {
			prefix = p.Bits()
		}
		for _, args := range [][]string{
			{"addr", "replace", fmt.Sprintf("%s/%d", meshIP, prefix), "dev", w.iface},
			{"link", "set", w.iface, "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				w.dev.Close()
				return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			}
		}
	}
	return w, nil
}

func (w *wg) close() {
	if w != nil && w.dev != nil {
		w.dev.Close()
	}
}

// devPeer is one peer as the device has it.
type devPeer struct {
	PublicKey     Key
	PSK           Key
	Endpoint      string
	AllowedIPs    []string
	Keepalive     int
	LastHandshake time.Time
	RxBytes       uint64
	TxBytes       uint64
}

// heardFrom says the peer has sent an authenticated message under its key.
// The first is its handshake initiation: WireGuard counts it in rx_bytes
// when it checks it, before it answers, while LastHandshake waits for the
// first data packet, which a rotating peer's mesh IP must already be on.
func (p *devPeer) heardFrom() bool { return p.RxBytes > 0 || !p.LastHandshake.IsZero() }

// peers reads the device's peers through UAPI.
func (w *wg) peers() (map[Key]*devPeer, error) {
	s, err := w.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("reading device config: %w", err)
	}
	return parseUAPI(s)
}

func parseUAPI(s string) (map[Key]*devPeer, error) {
	out := make(map[Key]*devPeer)
	var cur *devPeer
	var hsSec, hsNsec int64
	flush := func() {
		if cur != nil {
			if hsSec != 0 || hsNsec != 0 {
				cur.LastHandshake = time.Unix(hsSec, hsNsec)
			}
			sort.Strings(cur.AllowedIPs)
			out[cur.PublicKey] = cur
		}
		hsSec, hsNsec = 0, 0
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		if k == "public_key" {
			flush()
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != 32 {
				return nil, fmt.Errorf("uapi: bad public key %q", v)
			}
			cur = &devPeer{}
			copy(cur.PublicKey[:], b)
			continue
		}
		if cur == nil {
			continue
		}
		switch k {
		case "endpoint":
			cur.Endpoint = v
		case "preshared_key":
			b, err := hex.DecodeString(v)
			if err != nil || len(b) != 32 {
				return nil, fmt.Errorf("uapi: bad preshared key")
			}
			copy(cur.PSK[:], b)
		case "allowed_ip":
			cur.AllowedIPs = append(cur.AllowedIPs, v)
		case "persistent_keepalive_interval":
			cur.Keepalive, _ = strconv.Atoi(v)
		case "last_handshake_time_sec":
			hsSec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			hsNsec, _ = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			cur.RxBytes, _ = strconv.ParseUint(v, 10, 64)
		case "tx_bytes":
			cur.TxBytes, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	flush()
	return out, sc.Err()
}

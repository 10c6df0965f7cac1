// Command meshdev is a minimal control plane for meshd's namespace tests and
// benchmark: an embedded NATS server with JetStream, the provisioned store,
// the mesh registrar and two STUN listeners, in one process. Production runs
// the same registrar and STUN server inside `control server`.
//
// NATS runs in operator mode like `control server --auth`: the keys live in
// DATA/auth (created on first start), meshdev itself connects with control
// credentials it writes to DATA/control.creds, and every meshd needs mesh
// credentials for its machine, issued with the "creds" command.
//
// It prints "READY <json>" when serving, then answers one command per stdin
// line: "invite" -> "INVITE <token>", "creds <machine> <file>" (mesh
// credentials for machine, written to file, mode 0600) -> "CREDS <file>",
// "static <machine> <pubkey> <endpoint>" -> "STATIC <mesh ip>", "peers" ->
// "PEERS <json>". It exits on stdin EOF or SIGTERM. Errors are printed as
// "ERR <message>".
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgeplane/edgeplane/meshd/registrar"
	"github.com/edgeplane/edgeplane/meshd/relay"
	"github.com/edgeplane/edgeplane/meshd/stunserver"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/signers"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "meshdev:", err)
		os.Exit(1)
	}
}

func run() error {
	data := flag.String("data", "", "data dir for JetStream (required)")
	host := flag.String("host", "127.0.0.1", "address to listen on (NATS and STUN)")
	natsPort := flag.Int("nats-port", 4222, "NATS port")
	stunPort := flag.Int("stun-port", 3478, "first STUN port; the second is one above")
	cooldown := flag.Duration("cooldown", registrar.DefaultCooldown, "mesh IP cooldown after leave")
	relayPort := flag.Int("relay-port", 0, "run a mesh relay (TURN) on this port of --host; 0: none")
	flag.Parse()
	if *data == "" {
		return fmt.Errorf("--data is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	auth, err := storagenode.LoadAuth(filepath.Join(*data, "auth"), true)
	if err != nil {
		return err
	}
	names, _ := store.NewNames("", "")
	ctlCreds := filepath.Join(*data, "control.creds")
	if err := writeCreds(auth, storagenode.CredsRequest{Role: storagenode.RoleControl, Name: "meshdev", Names: names}, ctlCreds); err != nil {
		return err
	}
	ns, err := storagenode.Start(storagenode.Config{DataDir: *data, Listen: net.JoinHostPort(*host, strconv.Itoa(*natsPort)), Auth: auth})
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := store.Connect(store.ConnectOptions{URL: ns.ClientURL(), CredsFile: ctlCreds, Name: "meshdev"})
	if err != nil {
		return err
	}
	defer nc.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := store.Provision(pctx, nc, names, store.Layout{})
	if err == nil {
		// The registrar signs the peer records it writes.
		_, err = signers.Server(pctx, st, auth.Dir, *data, "meshdev")
	}
	cancel()
	if err != nil {
		return err
	}
	var stuns []string
	for i := 0; i < 2; i++ {
		s, err := stunserver.Listen(ctx, net.JoinHostPort(*host, strconv.Itoa(*stunPort+i)))
		if err != nil {
			return err
		}
		defer s.Close()
		stuns = append(stuns, s.Addr().String())
	}
	var relays []string
	if *relayPort != 0 {
		secret, err := st.MeshRelaySecret(ctx)
		if err != nil {
			return err
		}
		r, err := relay.Listen(ctx, relay.ServerConfig{Listen: net.JoinHostPort(*host, strconv.Itoa(*relayPort)), Secret: secret})
		if err != nil {
			return err
		}
		defer r.Close()
		relays = append(relays, r.Addr().String())
	}
	reg, err := registrar.New(st, registrar.Config{STUN: stuns, Relays: relays, Cooldown: *cooldown})
	if err != nil {
		return err
	}
	stopReg, err := reg.Serve(ctx)
	if err != nil {
		return err
	}
	defer stopReg()
	ready, _ := json.Marshal(map[string]any{"nats": ns.ClientURL(), "stun": stuns, "relays": relays, "auth": auth.Dir, "control_creds": ctlCreds})
	fmt.Printf("READY %s\n", ready)

	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			fmt.Println(answer(ctx, st, reg, auth, strings.Fields(line)))
		}
	}
}

func answer(ctx context.Context, st *store.Store, reg *registrar.Registrar, auth *storagenode.Auth, f []string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch {
	case len(f) == 3 && f[0] == "creds":
		if err := writeCreds(auth, storagenode.CredsRequest{Role: storagenode.RoleMesh, Machine: f[1], Names: st.Names}, f[2]); err != nil {
			return "ERR " + err.Error()
		}
		return "CREDS " + f[2]
	case len(f) == 1 && f[0] == "invite":
		tok, _, err := invites.Create(ctx, st, invites.Spec{Region: "dev", TTL: time.Hour})
		if err != nil {
			return "ERR " + err.Error()
		}
		return "INVITE " + tok
	case len(f) == 4 && f[0] == "static":
		ip, err := reg.AddStatic(ctx, f[1], f[2], []string{f[3]})
		if err != nil {
			return "ERR " + err.Error()
		}
		return "STATIC " + ip.String()
	case len(f) == 2 && f[0] == "rotate":
		rec, err := reg.RequestRotation(ctx, f[1])
		if err != nil {
			return "ERR " + err.Error()
		}
		return "ROTATE " + rec.PublicKey
	case len(f) == 1 && f[0] == "peers":
		list, err := st.MeshPeerList(ctx)
		if err != nil {
			return "ERR " + err.Error()
		}
		b, _ := json.Marshal(list)
		return "PEERS " + string(b)
	}
	return fmt.Sprintf("ERR unknown command %q", strings.Join(f, " "))
}

// writeCreds issues credentials for r into file (mode 0600).
func writeCreds(auth *storagenode.Auth, r storagenode.CredsRequest, file string) error {
	b, err := auth.IssueCreds(r)
	if err != nil {
		return err
	}
	if err := os.WriteFile(file, b, 0o600); err != nil {
		return fmt.Errorf("writing credentials: %w", err)
	}
	return nil
}

package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/store"
)

// Credentials. A control plane that listens beyond loopback runs NATS in
// operator mode: meshd then connects with mesh credentials issued for its
// machine (`control creds issue --role mesh --machine ID`). Their
// permissions name the machine, so they register, heartbeat and report
// drift for that machine only.

// checkCreds returns file as an absolute path (the state keeps it, and
// `meshd run` may start in another directory) after checking that it holds
// a user JWT. "" stays "" (loopback control planes need none).
func checkCreds(file string) (string, error) {
	if file == "" {
		return "", nil
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", fmt.Errorf("--creds %s: %w", file, err)
	}
	if _, err := readCreds(abs); err != nil {
		return "", fmt.Errorf("--creds: %w", err)
	}
	return abs, nil
}

func readCreds(file string) (*jwt.UserClaims, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading credentials: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", file, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: not a NATS user credentials file: %w", file, err)
	}
	return uc, nil
}

// credsWho describes whom a credentials file was issued for, for messages.
func credsWho(file string) string {
	uc, err := readCreds(file)
	if err != nil {
		return file
	}
	var role, machine string
	for _, t := range uc.Tags {
		if v, ok := strings.CutPrefix(t, "role:"); ok {
			role = v
		}
		if v, ok := strings.CutPrefix(t, "machine:"); ok {
			machine = v
		}
	}
	who := fmt.Sprintf("%s (user %q", file, uc.Name)
	if role != "" {
		who += ", role " + role
	}
	if machine != "" {
		who += ", machine " + machine
	}
	return who + ")"
}

// connectErr adds what to do when the control plane refuses the connection
// itself: no credentials, or credentials it does not trust.
func connectErr(err error, creds string) error {
	const needCreds = "the control plane requires credentials: pass --creds FILE with mesh credentials for this machine (`control creds issue --role mesh --machine ID -o FILE` on a storage node)"
	refused := strings.Contains(strings.ToLower(err.Error()), "authorization violation")
	switch {
	case creds == "" && (refused || errors.Is(err, store.ErrNoFleetCA)):
		// Mesh credentials carry the fleet CA too: what is missing is them.
		return fmt.Errorf("%w: %s", err, needCreds)
	case refused:
		return fmt.Errorf("%w: the control plane does not accept the credentials in %s (issued by another installation, or expired)", err, credsWho(creds))
	}
	return err
}

// callRegistrar sends one request to the registrar on its machine-bound
// subject. A publish the server refuses (credentials issued for another
// machine) yields no reply, only an asynchronous permissions error on the
// connection: the call watches for it and fails at once, saying so, rather
// than waiting out its timeout.
func callRegistrar(ctx context.Context, nc *nats.Conn, names store.Names, command, machine, creds string, req, resp any) error {
	denied := make(chan error, 1)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case denied <- err:
			default:
			}
		}
	})
	defer nc.SetErrorHandler(nil)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var perr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case perr = <-denied:
			cancel()
		case <-cctx.Done():
		}
	}()
	err := store.Call(cctx, nc, names.RegistrarSubject(command+"."+machine), "registrar", command, req, resp)
	cancel()
	<-done
	if perr != nil {
		who := "this connection"
		if creds != "" {
			who = "the credentials in " + credsWho(creds)
		}
		return fmt.Errorf("%s for machine %s refused by the control plane, nothing was changed (%w): %s may not act for %s; mesh credentials work only for the machine they were issued for: issue them with `control creds issue --role mesh --machine %s -o FILE` on a storage node",
			command, machine, perr, who, machine, machine)
	}
	return err
}

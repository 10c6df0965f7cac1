package enroll

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/pki"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// JoinRequest is how a box enrolls.
type JoinRequest struct {
	// Token is the invite from `control machine invite`; it names the CAs
	// a storage node must prove itself under.
	Token string
	// Machine is this box's machine ID.
	Machine string
	// Roles are the roles to enroll for; default Roles.
	Roles []string
	// Addrs are storage nodes' enrollment addresses (host:port), tried in
	// order until one answers.
	Addrs []string
	// Dir receives one credentials file per role, <role>.creds, mode 0600.
	Dir string
	// Timeout bounds each attempt; default 10s.
	Timeout time.Duration
}

// DefaultAddrs are the enrollment addresses of the storage nodes a NATS
// URL list (comma-separated) names: each host at DefaultPort.
func DefaultAddrs(natsURLs string) []string {
	var list []string
	for _, u := range strings.Split(natsURLs, ",") {
		if pu, err := url.Parse(strings.TrimSpace(u)); err == nil && pu.Hostname() != "" {
			list = append(list, net.JoinHostPort(pu.Hostname(), strconv.Itoa(DefaultPort)))
		}
	}
	return list
}

// CredsFile is the credentials file of role in dir.
func CredsFile(dir, role string) string { return filepath.Join(dir, role+".creds") }

// Join enrolls this box and returns the credentials files it wrote, by
// role. The storage node is checked before anything is sent: its TLS
// chain must hold a CA the token names, and its certificate must verify
// under that CA for the address dialed. Private keys are made here and
// written only to Dir.
func Join(ctx context.Context, r JoinRequest) (map[string]string, error) {
	cas, err := invites.CAs(r.Token)
	if err != nil {
		return nil, err
	}
	if len(cas) == 0 {
		return nil, store.Errorf(store.CodeInvalid, "the invite names no fleet CA: enrollment needs storage nodes that speak TLS (invite from a CLI whose credentials carry the CA)")
	}
	if len(r.Addrs) == 0 {
		return nil, store.Errorf(store.CodeInvalid, "no enrollment address: give the storage nodes' addresses")
	}
	roles := r.Roles
	if len(roles) == 0 {
		roles = Roles
	}
	seeds := map[string][]byte{}
	req := Request{Token: r.Token, Machine: r.Machine, Keys: map[string]string{}}
	for _, role := range roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		seeds[role], req.Keys[role] = seed, pub
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	var rep *Reply
	var ca *x509.Certificate
	var errs []error
	for _, addr := range r.Addrs {
		rep, ca, err = ask(ctx, addr, cas, req, timeout)
		if err == nil {
			break
		}
		errs = append(errs, err)
		// A node that refused the invite speaks for the fleet: asking
		// another changes nothing.
		if !store.HasCode(err, store.CodeUnavailable) && !store.HasCode(err, store.CodeTLS) {
			return nil, err
		}
	}
	if rep == nil {
		if len(errs) == 1 {
			return nil, errs[0]
		}
		return nil, store.Errorf(store.CodeUnavailable, "no storage node enrolled this box: %w", errors.Join(errs...))
	}
	bundle, err := pki.ParseCerts([]byte(rep.Bundle))
	if err != nil || !slices.ContainsFunc(bundle, func(c *x509.Certificate) bool { return pki.Fingerprint(c) == pki.Fingerprint(ca) }) {
		return nil, store.Errorf(store.CodeTLS, "the storage node's CA bundle does not hold the CA it proved itself under; refusing it")
	}
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials dir: %w", err)
	}
	files := map[string]string{}
	for _, role := range roles {
		token := rep.JWTs[role]
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil || uc.Subject != req.Keys[role] {
			return nil, store.Errorf(store.CodeInvalid, "the storage node answered role %s with a JWT for another key", role).With("role", role)
		}
		creds, err := jwt.FormatUserConfig(token, seeds[role])
		if err != nil {
			return nil, err
		}
		file := CredsFile(r.Dir, role)
		if err := writeFile(file, store.AppendBundle(creds, []byte(rep.Bundle))); err != nil {
			return nil, fmt.Errorf("writing %s: %w", file, err)
		}
		files[role] = file
	}
	return files, nil
}

// ask sends req to addr after checking the node there; ca is the CA it
// proved itself under.
func ask(ctx context.Context, addr string, cas []string, req Request, timeout time.Duration) (*Reply, *x509.Certificate, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, store.Errorf(store.CodeInvalid, "enrollment address %q: %w", addr, err)
	}
	var proved *x509.Certificate
	tc := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: host,
		// Verified below, against the CA the invite names rather than
		// the system's roots.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			ca, err := provenUnder(cs, host, cas)
			proved = ca
			return err
		},
	}
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: false}}
	defer client.CloseIdleConnections()
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+Path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hreq)
	if err != nil {
		var verr *verifyError
		if errors.As(err, &verr) {
			return nil, nil, store.Errorf(store.CodeTLS, "enrollment at %s: %s; nothing was sent", addr, verr.reason).With("addr", addr)
		}
		return nil, nil, store.Errorf(store.CodeUnavailable, "enrollment at %s: %w", addr, err).With("addr", addr)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, store.Errorf(store.CodeUnavailable, "enrollment at %s: %w", addr, err).With("addr", addr)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error *store.Error `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != nil {
			return nil, nil, e.Error
		}
		return nil, nil, store.Errorf(store.CodeUnavailable, "enrollment at %s: %s", addr, resp.Status).With("addr", addr)
	}
	var rep Reply
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, nil, store.Errorf(store.CodeInvalid, "enrollment at %s: undecodable answer: %w", addr, err)
	}
	return &rep, proved, nil
}

// verifyError is a node that did not prove itself.
type verifyError struct{ reason string }

func (e *verifyError) Error() string { return e.reason }

// provenUnder finds, in the chain a node presented, a CA whose fingerprint
// the invite names, and checks the node's certificate under it for host.
func provenUnder(cs tls.ConnectionState, host string, cas []string) (*x509.Certificate, error) {
	if len(cs.PeerCertificates) == 0 {
		return nil, &verifyError{"the node presented no certificate"}
	}
	for _, c := range cs.PeerCertificates[1:] {
		if !slices.Contains(cas, pki.Fingerprint(c)) {
			continue
		}
		if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pki.Pool([]*x509.Certificate{c}), DNSName: host,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return nil, &verifyError{fmt.Sprintf("its certificate does not verify under the invite's CA for %s: %v", host, err)}
		}
		return c, nil
	}
	var names []string
	for _, c := range cs.PeerCertificates {
		names = append(names, fmt.Sprintf("%q", c.Subject.CommonName))
	}
	return nil, &verifyError{fmt.Sprintf("the node's chain (%s) holds no CA the invite names", strings.Join(names, ", "))}
}

// writeFile writes data to a private file whole.
func writeFile(path string, data []byte) error { return atomicfile.Write(path, data, 0o600) }

// AgentCreds is the agent credentials file of a box whose agent was given
// no --creds: DIR/agent.creds when an earlier start enrolled the box, else,
// for an invite that names the fleet's CAs, the file enrolling the box now
// writes (its keys made here, one credentials file per role in r.Dir), and
// "" for an invite that names no CAs (a box on a store without
// credentials). r.Addrs defaults to the storage nodes natsURLs names, and
// r.Machine to this host's machine ID.
func AgentCreds(ctx context.Context, r JoinRequest, natsURLs string, progress io.Writer) (string, error) {
	saved := CredsFile(r.Dir, storagenode.RoleAgent)
	if _, err := os.Stat(saved); err == nil {
		return saved, nil
	}
	cas, err := invites.CAs(r.Token)
	if err != nil || r.Token == "" || len(cas) == 0 {
		return "", err
	}
	if len(r.Addrs) == 0 {
		r.Addrs = DefaultAddrs(natsURLs)
	}
	if r.Machine == "" {
		r.Machine = store.DefaultMachineID()
	}
	files, err := Join(ctx, r)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "enrolled machine %s: credentials (keys made on this box) in %s, %s and %s\n", r.Machine,
		files[storagenode.RoleAgent], files[storagenode.RoleMesh], files[storagenode.RoleGateway])
	return files[storagenode.RoleAgent], nil
}

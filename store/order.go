package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/signing"
)

// Signed orders. An agent RPC that runs, stops or replaces something on a
// box travels as an order signed by a signer the trust root certified, the
// same key that signs commits: control credentials alone (which may publish
// on every subject) cannot make an agent run anything. Candidates start
// before any commit names them (apply step 5 comes before the checkpoint),
// so what an agent checks is the order itself, not a commit: its signature
// covers the RPC subject (machine and command), the request (a start's
// whole spec) and an envelope that makes it good once, on one machine, for
// a few minutes.
//
// The agent verifies the exact bytes it received and decodes the request
// from those same bytes, so nothing unsigned reaches a handler. Store.Call
// signs; the package-level Call, for other services, does not.

// CodeOrderRefused is an agent's refusal of an order it may not act on:
// Detail["reason"] says why (an OrderReason).
const CodeOrderRefused = "order_refused"

// Why an order is refused: the signing package's reasons for its
// signature (unsigned, unknown_signer, retired_signer, bad_signature,
// malformed), and these.
const (
	OrderWrongMachine = "wrong_machine"
	OrderStale        = "stale"
	OrderReplayed     = "replayed"
)

// OrderLifetime is how long an order is good for after it was issued;
// MaxOrderLifetime bounds what an agent accepts (and how long it keeps a
// nonce); OrderClockSkew is how far the signer's clock and the agent's may
// disagree.
const (
	OrderLifetime    = 2 * time.Minute
	MaxOrderLifetime = 10 * time.Minute
	OrderClockSkew   = time.Minute
)

// OrdersScope is the name a retired signer's bounds would have to name
// for its orders to stand: none does, so a retired signer signs no order.
const OrdersScope = "agent orders"

// orderOp marks an order's signature, so that it can never pass for the
// signature of a stored message (whose operation is "" or "DEL").
const orderOp = "ORDER"

// IsOrder says whether command is one an agent runs only as a signed
// order: what starts, stops, restarts, drains or replaces something on a
// box. Reads (capacity, readiness, inventory, logs, images) are not.
func IsOrder(command string) bool {
	switch command {
	case CmdStartCandidate, CmdDrainInstance, CmdStopInstance, CmdRestart, CmdStop, CmdForceCleanup, CmdUpgrade:
		return true
	}
	return false
}

// Order is the envelope of a signed order.
type Order struct {
	Machine  string    `json:"machine"`
	Command  string    `json:"command"`
	IssuedAt time.Time `json:"issued_at"`
	NotAfter time.Time `json:"not_after"`
	// Nonce makes each order good once.
	Nonce string `json:"nonce"`
}

// orderBody is how an agent reads the envelope of what travels: the
// request's own JSON object with the envelope added under "order" (a key
// no request has). An agent of a release before signed orders reads the
// same bytes as the request it knew and ignores the envelope, so a
// control plane that signs can still deploy to and upgrade a fleet that
// does not check yet.
type orderBody struct {
	Order *Order `json:"order"`
}

// orderMessage is what the signature of an order for command on machine
// covers: the RPC subject of that command, and body.
func (n Names) orderMessage(machine, command string, body []byte) signing.Message {
	return signing.Message{Subject: n.RPCSubject(machine, command), Op: orderOp, Body: body}
}

// NewOrder is the envelope of an order for command on machine, issued
// now, good for OrderLifetime, with a nonce of its own.
func NewOrder(machine, command string, now time.Time) (Order, error) {
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return Order{}, fmt.Errorf("making an order's nonce: %w", err)
	}
	now = now.UTC()
	return Order{Machine: machine, Command: command, IssuedAt: now, NotAfter: now.Add(OrderLifetime), Nonce: hex.EncodeToString(nonce[:])}, nil
}

// SignOrder makes req, under o, an order signed by k: the body to send on
// n's RPC subject of o's machine and command, and its header.
func (n Names) SignOrder(k *signing.Key, o Order, req any) ([]byte, nats.Header, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding %s request: %w", o.Command, err)
	}
	if len(raw) < 2 || raw[0] != '{' {
		return nil, nil, fmt.Errorf("encoding %s order: the request is not a JSON object", o.Command)
	}
	env, err := json.Marshal(orderBody{Order: &o})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding %s order: %w", o.Command, err)
	}
	body := env[: len(env)-1 : len(env)-1] // {"order":{...}
	if len(raw) > 2 {
		body = append(body, ',')
	}
	body = append(body, raw[1:]...)
	h := nats.Header{}
	h.Set(signing.Header, k.Sign(n.orderMessage(o.Machine, o.Command, body)))
	return body, h, nil
}

// CanOrder says whether s can sign orders, and if not, why what would
// order machines to do something must not start.
func (s *Store) CanOrder(what string) error {
	if s.signer != nil {
		return nil
	}
	return &Error{Code: CodeSigningKeyRequired,
		Message: what + " needs a signing key: agents act only on orders signed by a certified signer; pass --signing-key FILE (control server writes DATA/signer.nk; `control signing issue` makes more)"}
}

// signOrder makes req an order to machine, signed by s's signer.
func (s *Store) signOrder(machine, command string, req any) ([]byte, nats.Header, error) {
	if err := s.CanOrder(fmt.Sprintf("telling machine %s to %s", machine, command)); err != nil {
		return nil, nil, AsError(err).With("machine", machine).With("command", command)
	}
	k, err := s.signer.SigningKey()
	if err != nil {
		return nil, nil, &Error{Code: CodeSigningKeyRequired, Message: err.Error()}
	}
	o, err := NewOrder(machine, command, time.Now())
	if err != nil {
		return nil, nil, err
	}
	return s.Names.SignOrder(k, o, req)
}

// VerifyOrder checks that data, with header, received on machine's
// subject for command, is an order a certified, active signer made for
// this machine and command, that it is fresh and that book has not seen
// it, and returns the request it carries. A refusal is a CodeOrderRefused
// *Error; an error that is no verdict (the trust root could not be read)
// is returned as it is.
func (s *Store) VerifyOrder(ctx context.Context, machine, command string, header nats.Header, data []byte, book *OrderBook) (json.RawMessage, *Order, error) {
	refuse := func(reason, signer, format string, args ...any) (json.RawMessage, *Order, error) {
		e := Errorf(CodeOrderRefused, "machine %s refuses %s: "+format, append([]any{machine, command}, args...)...).
			With("reason", reason).With("machine", machine).With("command", command)
		if signer != "" {
			e = e.With("signer", signer)
		}
		return nil, nil, e
	}
	sig := header.Get(signing.Header)
	if sig == "" {
		return refuse(signing.ReasonUnsigned, "", "the request is not a signed order (agents act only on orders signed by a certified signer)")
	}
	signer := signing.SignerOf(sig)
	var body orderBody
	if err := json.Unmarshal(data, &body); err != nil || body.Order == nil || body.Order.Nonce == "" {
		return refuse(signing.ReasonMalformed, signer, "not an order")
	}
	o := *body.Order
	if o.Machine != machine || o.Command != command {
		return refuse(OrderWrongMachine, signer, "the order is for %s on machine %s", o.Command, o.Machine)
	}
	now := time.Now()
	switch {
	case o.NotAfter.Sub(o.IssuedAt) > MaxOrderLifetime || o.NotAfter.Before(o.IssuedAt):
		return refuse(OrderStale, signer, "the order is good from %s to %s, longer than %s", o.IssuedAt.Format(time.RFC3339), o.NotAfter.Format(time.RFC3339), MaxOrderLifetime)
	case now.Add(OrderClockSkew).Before(o.IssuedAt):
		return refuse(OrderStale, signer, "the order was issued at %s, in this machine's future (clock skew beyond %s?)", o.IssuedAt.Format(time.RFC3339), OrderClockSkew)
	case now.After(o.NotAfter.Add(OrderClockSkew)):
		return refuse(OrderStale, signer, "the order expired at %s", o.NotAfter.Format(time.RFC3339))
	}
	t, _, err := s.Trust(ctx)
	if err != nil {
		return nil, nil, err
	}
	// The signer's certificate read now, not as learned earlier: a signer
	// retired a moment ago signs nothing more. A store that cannot be
	// asked leaves the trust as it was (no verdict).
	if lerr := s.LoadSigner(ctx, signer); HasCode(lerr, CodeNotFound) {
		t.Forget(signer)
	}
	msg := s.Names.orderMessage(machine, command, data)
	if _, err := t.Verify(OrdersScope, msg, sig); err != nil {
		reason := signing.Reason(err)
		switch reason {
		case "":
			return nil, nil, err
		case signing.ReasonRetired:
			return refuse(reason, signer, "signed by %s, a retired signer: it signs no order", signer)
		}
		return refuse(reason, signer, "%v", err)
	}
	if err := book.note(o.Nonce, o.NotAfter.Add(OrderClockSkew), now); err != nil {
		if errors.Is(err, errReplayed) {
			return refuse(OrderReplayed, signer, "order %s was received before", o.Nonce)
		}
		return nil, nil, Errorf(CodeUnavailable, "recording order %s: %w", o.Nonce, err)
	}
	return data, &o, nil
}

var errReplayed = errors.New("order seen before")

// OrderBook remembers the nonces of the orders an agent took until they
// expire, so that none is taken twice. With a file, they survive a
// restart of the agent: an order copied off the wire before it does not
// work after it either.
type OrderBook struct {
	mu    sync.Mutex
	seen  map[string]time.Time // nonce → until
	file  *os.File
	path  string
	lines int
}

// OpenOrderBook opens the book kept in path ("": in memory only), with
// the nonces it holds that have not expired.
func OpenOrderBook(path string) (*OrderBook, error) {
	b := &OrderBook{seen: map[string]time.Time{}, path: path}
	if path == "" {
		return b, nil
	}
	if f, err := os.Open(path); err == nil {
		now := time.Now()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			nonce, until, ok := strings.Cut(sc.Text(), " ")
			sec, err := strconv.ParseInt(until, 10, 64)
			if !ok || err != nil {
				continue // a line cut short by a crash
			}
			if u := time.Unix(sec, 0); u.After(now) {
				b.seen[nonce] = u
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("reading the order book %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading the order book: %w", err)
	}
	if err := b.rewrite(); err != nil {
		return nil, err
	}
	return b, nil
}

// Close closes the book's file.
func (b *OrderBook) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.file == nil {
		return nil
	}
	err := b.file.Close()
	b.file = nil
	return err
}

// note records nonce until then, or says it was seen.
func (b *OrderBook) note(nonce string, until, now time.Time) error {
	if b == nil {
		return errors.New("no order book")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[nonce]; ok {
		return errReplayed
	}
	for n, u := range b.seen {
		if !u.After(now) {
			delete(b.seen, n)
		}
	}
	b.seen[nonce] = until
	if b.path == "" {
		return nil
	}
	if b.lines > 2*len(b.seen)+256 {
		return b.rewrite()
	}
	// No fsync: what this guards against is a restarted agent, whose
	// writes the kernel kept; a box that lost power has a window of one
	// order's lifetime.
	if _, err := fmt.Fprintf(b.file, "%s %d\n", nonce, until.Unix()+1); err != nil {
		delete(b.seen, nonce)
		return err
	}
	b.lines++
	return nil
}

// rewrite replaces the file with the nonces held, and appends to it from
// then on.
func (b *OrderBook) rewrite() error {
	var buf bytes.Buffer
	for n, u := range b.seen {
		fmt.Fprintf(&buf, "%s %d\n", n, u.Unix()+1)
	}
	if err := atomicfile.Write(b.path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("writing the order book: %w", err)
	}
	f, err := os.OpenFile(b.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the order book: %w", err)
	}
	if b.file != nil {
		b.file.Close()
	}
	b.file, b.lines = f, len(b.seen)
	return nil
}

// headerKey carries a request's header in its handler's context.
type headerKey struct{}

// RequestHeader is the header of the request a Serve handler answers.
func RequestHeader(ctx context.Context) nats.Header {
	h, _ := ctx.Value(headerKey{}).(nats.Header)
	return h
}

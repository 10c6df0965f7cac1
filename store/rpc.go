package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultRPCTimeout bounds a request to a machine when the caller's context
// has no earlier deadline.
const DefaultRPCTimeout = 5 * time.Second

// rpcReply is the envelope of every RPC answer.
type rpcReply struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Call sends req to command on machine and decodes the answer into resp (may
// be nil). A command that changes what the machine runs (IsOrder) goes as
// an order signed by s's signer, and without one is refused here with
// CodeSigningKeyRequired. No responder, a timeout or a transport failure
// becomes an *RPCFailure; an error the machine returned comes back as its
// *Error. A call whose ask or answer the storage node lost is asked again
// (see request).
func (s *Store) Call(ctx context.Context, machine, command string, req, resp any) error {
	subject := s.Names.RPCSubject(machine, command)
	if !IsOrder(command) {
		data, err := json.Marshal(req)
		if err != nil {
			return fmt.Errorf("encoding %s request: %w", command, err)
		}
		return call(ctx, s.NC, &nats.Msg{Subject: subject, Data: data}, machine, command, resp, s.Names.RPCSubject(machine, ""))
	}
	data, h, err := s.signOrder(machine, command, req)
	if err != nil {
		return err
	}
	return call(ctx, s.NC, &nats.Msg{Subject: subject, Header: h, Data: data}, machine, command, resp, s.Names.RPCSubject(machine, ""))
}

// Call is Store.Call on an explicit connection and subject, unsigned: for
// services other than the agents' (registrar, admission), and for tests
// that send what a caller without a signing key could. It asks once: those
// services run in queue groups of several control servers, and an ask
// again could reach another, which would run the command a second time.
func Call(ctx context.Context, nc *nats.Conn, subject, machine, command string, req, resp any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encoding %s request: %w", command, err)
	}
	return call(ctx, nc, &nats.Msg{Subject: subject, Data: data}, machine, command, resp, "")
}

// call asks req and decodes its answer; responder: see request.
func call(ctx context.Context, nc *nats.Conn, req *nats.Msg, machine, command string, resp any, responder string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRPCTimeout)
		defer cancel()
	}
	msg, err := request(ctx, nc, req, responder)
	if err != nil {
		f := &RPCFailure{Machine: machine, Command: command, Cause: CauseTransport, Detail: err.Error()}
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			f.Cause, f.Detail = CauseNoResponders, "no agent is listening for this machine"
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			f.Cause, f.Detail = CauseTimeout, "no answer before the deadline"
		}
		return f
	}
	var rep rpcReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return &RPCFailure{Machine: machine, Command: command, Cause: CauseRemote, Detail: "undecodable reply: " + err.Error()}
	}
	if rep.Error != nil {
		if rep.Error.Code == "" {
			// A remote error must be actionable; one without a code is a
			// broken reply, not a verdict.
			return &RPCFailure{Machine: machine, Command: command, Cause: CauseRemote, Detail: "reply carries an error without a code: " + rep.Error.Message}
		}
		return rep.Error
	}
	if resp != nil && len(rep.Result) > 0 {
		if err := json.Unmarshal(rep.Result, resp); err != nil {
			return &RPCFailure{Machine: machine, Command: command, Cause: CauseRemote, Detail: "undecodable result: " + err.Error()}
		}
	}
	return nil
}

// RequesterHeader is where a storage node says who sent a request that
// crossed an import sharing its requester (nats-server's
// Nats-Request-Info): the server writes it, whatever the client sent.
const RequesterHeader = "Nats-Request-Info"

type requesterKey struct{}

// Requester is who sent a request, as the storage node that took it says.
type Requester struct {
	// Account is the requester's account (its public key).
	Account string `json:"acc"`
	// User is the requester's user public key (U...).
	User string `json:"user"`
	Name string `json:"name,omitempty"`
}

// RequesterOf is who sent the request a Serve handler answers, when the
// request crossed an import that shares it (false otherwise).
func RequesterOf(ctx context.Context) (Requester, bool) {
	raw, _ := ctx.Value(requesterKey{}).(string)
	var r Requester
	if raw == "" || json.Unmarshal([]byte(raw), &r) != nil || r.User == "" {
		return Requester{}, false
	}
	return r, true
}

// Handler answers one RPC command. data is the raw request, and
// RequestHeader(ctx) its header. Returning an error sends it as a
// structured error.
type Handler func(ctx context.Context, command string, data []byte) (any, error)

// Serve subscribes handler to subject in queue group queue. The command passed
// to handler is the subject's tail after prefix. Each request runs in its own
// goroutine bounded by ctx; the subscription ends when ctx ends (the caller
// owns ctx), and the returned func unsubscribes and waits for handlers.
func Serve(ctx context.Context, nc *nats.Conn, subject, queue, prefixToken string, handler Handler) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	sv := &served{subject: subject, queue: queue}
	var calls callLog
	// handle answers m; done is called once the answer is sent.
	handle := func(m *nats.Msg, done func()) {
		sv.inflight.Add(1)
		done0 := done
		done = func() { sv.inflight.Add(-1); done0() }
		if !ReplyOK(m.Reply) {
			// Answering would publish, with this responder's permissions,
			// wherever the requester chose: into a stream or a lock key.
			done()
			return
		}
		id := m.Header.Get(CallIDHeader)
		if id != "" && calls.ask(id, m) {
			done()
			return
		}
		command := commandOf(m.Subject, prefixToken)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer done()
			defer func() { <-sem }()
			hctx := context.WithValue(ctx, headerKey{}, m.Header)
			if ri := m.Header.Get(RequesterHeader); ri != "" {
				hctx = context.WithValue(hctx, requesterKey{}, ri)
			}
			res, herr := safeHandle(hctx, handler, command, m.Data)
			var rep rpcReply
			if herr != nil {
				rep.Error = AsError(herr)
			} else if res != nil {
				b, err := json.Marshal(res)
				if err != nil {
					rep.Error = Errorf(CodeInternal, "encoding %s result: %w", command, err)
				} else {
					rep.Result = b
				}
			}
			out, _ := json.Marshal(rep)
			if id != "" {
				calls.answer(id, out)
			} else {
				_ = m.Respond(out)
			}
		}()
	}
	sv.handle, sv.nc = handle, nc
	err := sv.subscribe()
	if err == nil {
		addServed(nc, sv)
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("subscribing %s: %w", subject, err)
	}
	// The SUB travels asynchronously; without a round trip a caller that
	// learns of this responder (say, from a record written next) can reach the
	// server first and get "no responders". A failed flush is not fatal: the
	// client replays the subscription when it reconnects.
	flushCtx, flushCancel := context.WithTimeout(ctx, 5*time.Second)
	_ = nc.FlushWithContext(flushCtx)
	flushCancel()
	stop := func() {
		removeServed(nc, sv)
		sv.stop()
		cancel()
		wg.Wait()
	}
	go func() {
		<-ctx.Done()
		removeServed(nc, sv)
		sv.stop()
	}()
	return stop, nil
}

// served is one responder Serve runs on a connection: what a renewal's
// bridge (RenewCreds) answers while the connection switches keys.
type served struct {
	subject, queue string
	nc             *nats.Conn
	handle         func(m *nats.Msg, done func())
	// inflight counts the requests being answered.
	inflight atomic.Int64

	mu      sync.Mutex
	sub     *nats.Subscription
	stopped bool
}

func (sv *served) subscribe() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.stopped || sv.sub != nil {
		return nil
	}
	sub, err := sv.nc.QueueSubscribe(sv.subject, sv.queue, func(m *nats.Msg) { sv.handle(m, func() {}) })
	if err != nil {
		return err
	}
	sv.sub = sub
	return nil
}

// pause stops taking requests on the connection (a bridge takes them).
// The subscription is drained, not dropped: the server may have handed it
// requests before it learned of the change, and an unsubscribed client
// discards those unanswered. It returns the draining subscription (nil if
// there was none), invalid once every request it took was handed to
// handle.
func (sv *served) pause() *nats.Subscription {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sub := sv.sub
	if sub != nil {
		if err := sub.Drain(); err != nil {
			_ = sub.Unsubscribe()
		}
		sv.sub = nil
	}
	return sub
}

func (sv *served) stop() {
	sv.pause()
	sv.mu.Lock()
	sv.stopped = true
	sv.mu.Unlock()
}

var servedMu sync.Mutex
var servedOn = map[*nats.Conn][]*served{}

func addServed(nc *nats.Conn, sv *served) {
	servedMu.Lock()
	defer servedMu.Unlock()
	servedOn[nc] = append(servedOn[nc], sv)
}

func removeServed(nc *nats.Conn, sv *served) {
	servedMu.Lock()
	defer servedMu.Unlock()
	list := servedOn[nc]
	for i, x := range list {
		if x == sv {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(servedOn, nc)
	} else {
		servedOn[nc] = list
	}
}

func servedBy(nc *nats.Conn) []*served {
	servedMu.Lock()
	defer servedMu.Unlock()
	return append([]*served(nil), servedOn[nc]...)
}

// ReplyOK reports whether a responder may answer on reply: a requester's
// inbox ("_INBOX." and the per-user "_INBOX.<user>." of credentials), or
// the reply subject NATS gives a request that came through a service import
// ("_R_."). Every responder of edgeplane answers nothing else.
func ReplyOK(reply string) bool {
	return strings.HasPrefix(reply, "_INBOX.") || strings.HasPrefix(reply, "_R_.")
}

func safeHandle(ctx context.Context, h Handler, command string, data []byte) (res any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Errorf(CodeInternal, "%s panicked: %v", command, r)
		}
	}()
	return h(ctx, command, data)
}

// commandOf returns the part of subject after the token marker, e.g. for
// marker "node.m1" and subject "...rpc.node.m1.deploy.start" it returns
// "deploy.start".
func commandOf(subject, marker string) string {
	i := strings.Index(subject, "."+marker+".")
	if i < 0 {
		return subject
	}
	return subject[i+len(marker)+2:]
}

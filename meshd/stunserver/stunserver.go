// Package stunserver is the small STUN (RFC 5389) binding server that
// `control server` runs so meshd nodes can learn the public address of their
// WireGuard socket. It answers Binding requests with XOR-MAPPED-ADDRESS and
// ignores everything else.
package stunserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/pion/stun/v3"
)

// Server is a running STUN server.
type Server struct {
	conn *net.UDPConn
	done chan struct{}
	once sync.Once
}

// Listen opens addr (host:port, UDP) and answers STUN binding requests until
// ctx ends or Close is called. Listen on a concrete address (the box's
// public or namespace address), not 0.0.0.0, where a box has several.
func Listen(ctx context.Context, addr string) (*Server, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("stun server: resolving %q: %w", addr, err)
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("stun server: listening on %s: %w", addr, err)
	}
	return Serve(ctx, c), nil
}

// Serve answers on an already-open socket (for callers that open it in a
// specific network namespace). The server owns c from now on.
func Serve(ctx context.Context, c *net.UDPConn) *Server {
	s := &Server{conn: c, done: make(chan struct{})}
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	go s.loop()
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() *net.UDPAddr { return s.conn.LocalAddr().(*net.UDPAddr) }

// Close stops the server.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		err = s.conn.Close()
	})
	return err
}

func (s *Server) loop() {
	buf := make([]byte, 1500)
	req := new(stun.Message)
	resp := new(stun.Message)
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !stun.IsMessage(buf[:n]) {
			continue
		}
		req.Raw = append(req.Raw[:0], buf[:n]...)
		if err := req.Decode(); err != nil || req.Type != stun.BindingRequest {
			continue
		}
		resp.Reset()
		from = net.UDPAddrFromAddrPort(from).AddrPort() // unmap v4-in-v6
		err = resp.Build(
			stun.NewTransactionIDSetter(req.TransactionID),
			stun.BindingSuccess,
			&stun.XORMappedAddress{IP: from.Addr().Unmap().AsSlice(), Port: int(from.Port())},
			stun.Fingerprint,
		)
		if err != nil {
			continue
		}
		_, _ = s.conn.WriteToUDPAddrPort(resp.Raw, from)
	}
}

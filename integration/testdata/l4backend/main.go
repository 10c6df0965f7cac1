// Command l4backend is the layer-4 tests' backend: an instance the agent
// starts (HOST, PORT and EDGEPLANE_INSTANCE in its environment) that says
// which service and instance answered, so a test reaching it through a
// gateway port can tell where each connection went.
//
//	l4backend dns           DNS on PORT over UDP and TCP: any TXT question is
//	                        answered "instance=ID" and "version=$VERSION"
//	l4backend tls HOST...   TLS on PORT with a self-signed certificate of its
//	                        own for HOST...: after the handshake it writes
//	                        "service=$SERVICE instance=ID\n" and closes
//
// The agent's readiness check without a path is a TCP connect: both modes
// listen on TCP.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log"
	"math/big"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) < 2 {
		log.Fatal("usage: l4backend dns | l4backend tls HOST...")
	}
	addr := net.JoinHostPort(os.Getenv("HOST"), os.Getenv("PORT"))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "dns":
		err = serveDNS(ctx, addr)
	case "tls":
		err = serveTLS(ctx, addr, os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// serveDNS answers on addr over UDP and TCP until ctx ends.
func serveDNS(ctx context.Context, addr string) error {
	txt := []string{"instance=" + os.Getenv("EDGEPLANE_INSTANCE"), "version=" + os.Getenv("VERSION")}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, question := range q.Question {
			if question.Qtype == dns.TypeTXT {
				m.Answer = append(m.Answer, &dns.TXT{
					Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 0},
					Txt: txt,
				})
			}
		}
		_ = w.WriteMsg(m)
	})
	errs := make(chan error, 2)
	servers := []*dns.Server{{Addr: addr, Net: "udp", Handler: handler}, {Addr: addr, Net: "tcp", Handler: handler}}
	for _, s := range servers {
		go func() { errs <- s.ListenAndServe() }()
	}
	log.Printf("dns on %s (udp and tcp)", addr)
	select {
	case err := <-errs:
		return fmt.Errorf("serving dns: %w", err)
	case <-ctx.Done():
	}
	for _, s := range servers {
		_ = s.Shutdown()
	}
	return nil
}

// serveTLS terminates TLS on addr with a certificate for hosts and tells
// each client which service and instance it reached.
func serveTLS(ctx context.Context, addr string, hosts []string) error {
	if len(hosts) == 0 {
		return fmt.Errorf("tls: name at least one host")
	}
	cert, err := selfSigned(hosts)
	if err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	hello := fmt.Sprintf("service=%s instance=%s\n", os.Getenv("SERVICE"), os.Getenv("EDGEPLANE_INSTANCE"))
	log.Printf("tls on %s for %v", addr, hosts)
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting: %w", err)
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			// The readiness probe connects and hangs up: its handshake
			// fails, and that is all.
			if err := c.(*tls.Conn).Handshake(); err != nil {
				return
			}
			_, _ = c.Write([]byte(hello))
		}()
	}
}

// selfSigned is a throwaway certificate for hosts, the first its subject.
func selfSigned(hosts []string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: hosts[0], Organization: []string{"l4backend"}},
		DNSNames:     hosts,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("creating certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

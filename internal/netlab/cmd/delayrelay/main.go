// Command delayrelay is the multi-region lab's wire: it creates a TUN
// device, prints "delayrelay ready" once it reads from it, and holds every
// packet the router sends it for the one-way delay of its pair of
// networks (netlab.Relay) before writing it back. It runs in the lab's
// router namespace until SIGTERM or SIGINT.
//
//	delayrelay --tun dly0 --link 10.215.1.0/24,10.215.2.0/24=30ms --link ...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/edgeplane/edgeplane/internal/netlab"
)

type linkFlags []netlab.Link

func (l *linkFlags) String() string { return fmt.Sprint(*l) }

func (l *linkFlags) Set(s string) error {
	link, err := netlab.ParseLink(s)
	if err != nil {
		return err
	}
	*l = append(*l, link)
	return nil
}

func main() {
	var links linkFlags
	name := flag.String("tun", "dly0", "the TUN device to create and relay through")
	flag.Var(&links, "link", "A,B=RTT: packets between networks A and B take RTT round trip (repeatable)")
	flag.Parse()
	if err := run(*name, links); err != nil {
		fmt.Fprintln(os.Stderr, "delayrelay:", err)
		os.Exit(1)
	}
}

func run(name string, links []netlab.Link) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	dev, err := netlab.OpenTUN(name)
	if err != nil {
		return err
	}
	relay := netlab.NewRelay(dev, links)
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	var desc []string
	for _, l := range links {
		desc = append(desc, fmt.Sprintf("%s<->%s %s", l.A, l.B, l.RTT))
	}
	fmt.Printf("delayrelay ready on %s: %s\n", name, strings.Join(desc, ", "))
	select {
	case err = <-done:
	case <-ctx.Done():
		// Closing the device ends the relay's read; Run then returns.
		dev.Close()
		err = <-done
	}
	fmt.Printf("delayrelay stopped, %d packets dropped\n", relay.Drops())
	return err
}

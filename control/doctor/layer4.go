package doctor

import (
	"context"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/store"
)

// drainSlack is how long after a drain's deadline a gateway may still
// list it: it ends the connections at the deadline and reports the change
// promptly, so a few seconds cover a report in flight.
const drainSlack = 5 * time.Second

// checkLayer4 says where layer 4 disagrees: a gateway port or passthrough
// host two services expose (a problem), and what gateways report: a port the routing
// asks for that a gateway cannot open (the service is unreachable there on
// it; everything else is served) and a connection left draining past its
// service's drain timeout (a deploy waits on it, and the instance it
// reaches may be stopped under it), each a warning.
func (d *doctor) checkLayer4(ctx context.Context) error {
	// Claims keep a port and a passthrough host to one namespace; two
	// services exposing one are records the claims should have kept out.
	for _, c := range d.view.Layer4().Conflicts() {
		d.add(LayerRouting, Problem, c.Entry, "exposed by services %s and %s; gateways serve %s only", c.Owner, strings.Join(c.Others, ", "), c.Owner)
	}
	return d.s.ListGatewayObservations(ctx, func(o *store.GatewayObservation) error {
		if d.now.Sub(o.At) >= store.GatewayObservationTTL {
			return nil
		}
		subj := "gateway " + o.Gateway
		for _, e := range o.L4Errors {
			since := ""
			if !e.Since.IsZero() {
				since = " (since " + e.Since.UTC().Format("2006-01-02 15:04:05Z") + ")"
			}
			d.add(LayerGateways, Warning, subj, "cannot open port %s for %s/%s%s: %s; it retries, and serves everything else", e.Port, e.Namespace, e.Service, since, e.Error)
		}
		for _, dr := range o.L4Draining {
			if !o.At.After(dr.Until) && d.now.Sub(dr.Until) <= drainSlack {
				continue
			}
			d.add(LayerGateways, Warning, subj, "keeps %d layer-4 connections of %s/%s to %s past their drain deadline (%s, %s ago; listed in its report at %s)",
				dr.Conns, dr.Namespace, dr.Service, dr.Instance, dr.Until.UTC().Format("15:04:05Z"),
				d.now.Sub(dr.Until).Round(time.Second), o.At.UTC().Format("15:04:05Z"))
		}
		return nil
	})
}

// isLayer4Conflict says whether a conflict a gateway reports is about a
// gateway port or a passthrough host ("tcp/5432: ...", "tls/db.example.com:
// ..."), not an HTTP host.
func isLayer4Conflict(c string) bool {
	for _, p := range []string{store.ProtoTCP + "/", store.ProtoUDP + "/", "tls/"} {
		if strings.HasPrefix(c, p) {
			return true
		}
	}
	return false
}

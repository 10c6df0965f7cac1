package projection

import (
	"maps"
	"slices"
	"strings"

	"github.com/edgeplane/edgeplane/store"
)

// Layer 4 in the view: which service a gateway port, or the server name of
// a passthrough TLS connection, reaches. Few services expose any, so the
// view keeps only their keys as it changes and builds the index on first
// use, once per view.

// markLayer4 notes whether service key exposes layer-4 entry points.
func (b *builder) markLayer4(key string, on bool) {
	if b.v.layer4[key] == on {
		return
	}
	if !b.ownL4 {
		b.v.layer4, b.ownL4 = maps.Clone(b.v.layer4), true
		if b.v.layer4 == nil {
			b.v.layer4 = map[string]bool{}
		}
	}
	if on {
		b.v.layer4[key] = true
	} else {
		delete(b.v.layer4, key)
	}
}

// L4Entry is one gateway port and the service it reaches.
type L4Entry struct {
	store.PortKey
	Service *Service
}

// PassthroughEntry is one passthrough server name and its service.
type PassthroughEntry struct {
	Host    string
	Service *Service
}

// L4Conflict is a gateway port or passthrough host that more than one
// service exposes: records the store's port and host claims should have
// kept out. Only Owner ("namespace/service", the lowest) is served.
type L4Conflict struct {
	// Entry is "tcp/5432" or "tls/db.example.com".
	Entry  string   `json:"entry"`
	Owner  string   `json:"owner"`
	Others []string `json:"others"`
}

// Layer4Index is what a view routes below HTTP. Immutable; share it.
type Layer4Index struct {
	ports       map[store.PortKey]*Service
	passthrough map[string]*Service
	entries     []L4Entry
	hosts       []PassthroughEntry
	conflicts   []L4Conflict
}

// Layer4 is the view's layer-4 index, built on first use.
func (v *View) Layer4() *Layer4Index {
	v.lists.l4Once.Do(func() { v.lists.l4 = buildLayer4(v) })
	return v.lists.l4
}

func buildLayer4(v *View) *Layer4Index {
	x := &Layer4Index{}
	if len(v.layer4) == 0 {
		return x
	}
	keys := slices.Sorted(maps.Keys(v.layer4))
	// Services in key order: the first to claim an entry owns it, which
	// is the lowest namespace (then service), on every gateway alike.
	others := map[string][]string{}
	x.ports = map[store.PortKey]*Service{}
	x.passthrough = map[string]*Service{}
	for _, key := range keys {
		s, ok := v.services.get(key)
		if !ok {
			continue
		}
		for _, k := range s.Layer4.Ports() {
			if k.Port < 1 || k.Port > 65535 || k.Reserved() {
				continue
			}
			if owner, taken := x.ports[k]; taken {
				if owner != s {
					others[k.String()] = append(others[k.String()], s.Key())
				}
				continue
			}
			x.ports[k] = s
			x.entries = append(x.entries, L4Entry{PortKey: k, Service: s})
		}
		for _, h := range s.Layer4.PassthroughHosts() {
			n, ok := normalizeHost(h)
			if !ok || strings.Contains(n, "*") {
				continue
			}
			if owner, taken := x.passthrough[n]; taken {
				if owner != s {
					others["tls/"+n] = append(others["tls/"+n], s.Key())
				}
				continue
			}
			x.passthrough[n] = s
			x.hosts = append(x.hosts, PassthroughEntry{Host: n, Service: s})
		}
	}
	slices.SortFunc(x.entries, func(a, b L4Entry) int { return a.PortKey.Compare(b.PortKey) })
	slices.SortFunc(x.hosts, func(a, b PassthroughEntry) int { return strings.Compare(a.Host, b.Host) })
	for entry, o := range others {
		c := L4Conflict{Entry: entry, Others: o}
		if h, ok := strings.CutPrefix(entry, "tls/"); ok {
			c.Owner = x.passthrough[h].Key()
		} else if k, err := store.ParsePortKey(entry); err == nil {
			c.Owner = x.ports[k].Key()
		}
		x.conflicts = append(x.conflicts, c)
	}
	slices.SortFunc(x.conflicts, func(a, b L4Conflict) int { return strings.Compare(a.Entry, b.Entry) })
	return x
}

// Port is the service gateway port k reaches.
func (x *Layer4Index) Port(k store.PortKey) (*Service, bool) {
	s, ok := x.ports[k]
	return s, ok
}

// Passthrough is the service a TLS connection with server name sni
// reaches without being terminated; sni may carry any case or a trailing
// dot.
func (x *Layer4Index) Passthrough(sni string) (*Service, bool) {
	if len(x.passthrough) == 0 {
		return nil, false
	}
	n, ok := normalizeHost(sni)
	if !ok {
		return nil, false
	}
	s, ok := x.passthrough[n]
	return s, ok
}

// Ports lists the gateway ports routed, by protocol then number.
func (x *Layer4Index) Ports() []L4Entry { return x.entries }

// PassthroughHosts lists the passthrough server names, sorted.
func (x *Layer4Index) PassthroughHosts() []PassthroughEntry { return x.hosts }

// Conflicts lists the entries more than one service exposes.
func (x *Layer4Index) Conflicts() []L4Conflict { return x.conflicts }

// Empty says nothing is routed below HTTP.
func (x *Layer4Index) Empty() bool { return len(x.entries) == 0 && len(x.hosts) == 0 }

package store

import "time"

// Counts are instances by what they are doing (fleet status, written by
// control/fleet's aggregator). Stale counts instances on
// a machine whose heartbeat is stale or offline, whatever their record
// says (they are counted there and not under their state).
type Counts struct {
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
	Backoff  int `json:"backoff,omitempty"`
	Failed   int `json:"failed,omitempty"`
	Draining int `json:"draining,omitempty"`
	Stopped  int `json:"stopped,omitempty"`
	Stale    int `json:"stale,omitempty"`
}

// Add counts one instance in state, or as stale.
func (c *Counts) Add(state InstanceState, stale bool) {
	switch {
	case stale:
		c.Stale++
	case state == InstanceReady:
		c.Ready++
	case state == InstanceStarting:
		c.Starting++
	case state == InstanceBackoff:
		c.Backoff++
	case state == InstanceFailed:
		c.Failed++
	case state == InstanceDraining:
		c.Draining++
	default:
		c.Stopped++
	}
}

// Total is every instance counted.
func (c Counts) Total() int {
	return c.Ready + c.Starting + c.Backoff + c.Failed + c.Draining + c.Stopped + c.Stale
}

// NamespaceStatus is one namespace's summary. Key: the namespace.
type NamespaceStatus struct {
	Version   int    `json:"version"`
	Namespace string `json:"namespace"`
	Counts    Counts `json:"counts"`
	// Deploys counts the instances of each deploy (the live one and any
	// in progress), Machines those on each machine.
	Deploys  map[string]Counts `json:"deploys"`
	Machines map[string]Counts `json:"machines"`
	// MachinesTrimmed is set when Machines lists only the machines with
	// something other than ready instances (a namespace on very many
	// machines: the record must stay small).
	MachinesTrimmed bool `json:"machines_trimmed,omitempty"`
	// LastErrors is the latest error an instance recorded, by machine.
	LastErrors map[string]string `json:"last_errors,omitempty"`
	// Traffic is each service's traffic as the gateways report it (see
	// GatewayTraffic), by service name.
	Traffic map[string]ServiceTrafficStatus `json:"traffic,omitempty"`
	// SetAside are the namespace's endpoints some gateway sends no new
	// request to, by gateway (at most MaxSetAsideReported in all).
	SetAside map[string][]EndpointSetAside `json:"set_aside,omitempty"`
	// Revision is the instance records' stream sequence the counts are
	// complete up to: every instance record write at or below it is
	// counted. A reader that wrote a record at revision R sees its effect
	// in the first summary with Revision >= R.
	Revision uint64 `json:"revision,omitempty"`
	// Observed is the same for the instance observations' stream
	// (MachineObserved). The aggregator writes a summary when what it
	// says changed, and one that did not only every few seconds to bring
	// these two along: a reader waiting for its write to be counted
	// follows FleetStatusFlushed, which says so after every flush.
	Observed  uint64    `json:"observed,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (r *NamespaceStatus) version() int { return r.Version }

// KeyOK checks the summary is filed under its namespace.
func (r *NamespaceStatus) KeyOK(key string) error { return keyMust(key, r.Namespace) }

// FleetStatusFlushed is the aggregator's word after a flush: every
// namespace summary in the store counts every instance record write up to
// Revision and every observation write up to Observed, whether the flush
// rewrote it or found it unchanged. Published on
// Names.FleetStatusFlushedSubject (core NATS, not stored): it is for a
// reader following the summaries as they are written, as the stored
// summaries' own revisions are only brought along every few seconds.
type FleetStatusFlushed struct {
	Revision uint64    `json:"revision"`
	Observed uint64    `json:"observed"`
	At       time.Time `json:"at"`
}

package store

import "fmt"

// Records whose key a reader checks against their body (keyed). Each one
// is written by a role whose permissions name the key; the body is the
// writer's word only.

// errKeyMismatch is a record filed under a key its body does not name.
func errKeyMismatch(key, want string) error {
	return fmt.Errorf("record under key %q says it belongs under %q: skipped", key, want)
}

func keyMust(key, want string) error {
	if key != want {
		return errKeyMismatch(key, want)
	}
	return nil
}

// KeyOK checks that the record is the one its key names: its namespace,
// machine and instance.
func (r *InstanceRecord) KeyOK(key string) error { return keyMust(key, r.Key()) }

// KeyOK checks that the machine record is filed under its machine's ID.
func (r *MachineRecord) KeyOK(key string) error { return keyMust(key, r.ID) }

// KeyOK checks that the peer record is filed under its machine.
func (r *MeshPeerRecord) KeyOK(key string) error { return keyMust(key, MeshPeerKey(r.Machine)) }

// KeyOK checks that the heartbeat is filed under its machine.
func (r *MeshHeartbeat) KeyOK(key string) error { return keyMust(key, MeshBeatKey(r.Machine)) }

// KeyOK checks that the drift report is filed under its machine.
func (r *MeshDriftReport) KeyOK(key string) error { return keyMust(key, MeshDriftKey(r.Machine)) }

// KeyOK checks that the observation is filed under its gateway's name.
func (r *GatewayObservation) KeyOK(key string) error { return keyMust(key, KeySafe(r.Gateway)) }

// KeyOK checks that the revocation is filed under the user it refuses.
func (r *Revocation) KeyOK(key string) error { return keyMust(key, r.User) }

// KeyOK checks that the certificate is filed under its signer's key.
func (r *SignerRecord) KeyOK(key string) error { return keyMust(key, SignerKey(r.Key)) }

// SubjectOK checks that the event is filed on the subject of the service or
// machine its body names.
func (r *RoutingEvent) SubjectOK(n Names, subject string) error {
	var want string
	switch r.Kind {
	case EventServiceUpsert, EventServiceRemove:
		want = n.RoutingServiceSubject(r.Namespace, r.Service)
	case EventMachineUpsert, EventMachineRemove:
		if r.Machine == nil {
			return fmt.Errorf("%s event without a machine", r.Kind)
		}
		want = n.RoutingMachineSubject(r.Machine.ID)
	case EventRegionUpsert:
		if err := r.regionOK(); err != nil {
			return err
		}
		want = n.RoutingRegionSubject(r.Region.Name)
	case EventMaintenanceUpsert:
		if err := r.maintenanceOK(); err != nil {
			return err
		}
		want = n.RoutingMaintenanceSubject(r.Maintenance.Namespace, r.Maintenance.Service)
	default:
		return fmt.Errorf("unknown routing event kind %q", r.Kind)
	}
	if subject != want {
		return fmt.Errorf("%s event of %s is filed on %s, not on %s", r.Kind, r.Identity(), subject, want)
	}
	return nil
}

package cuts_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/edgeplane/edgeplane/control/machines"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/invites"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// joined is a machine whose admission the store acknowledged: the
// invite it joined with and the user key its enrollment recorded.
type joined struct {
	token, user string
}

// machineLedger is what admissions and removals were acknowledged as.
type machineLedger struct {
	auth *storagenode.Auth
	n    atomic.Int64

	mu       sync.Mutex
	admitted map[string]joined
	removed  map[string]joined
	// removing are the removals started and not acknowledged: a cut
	// may have left each anywhere between nothing and done.
	removing map[string]joined
	// busyRetries counts the removals run again while a lease the cut
	// left held refused them.
	busyRetries int
}

// admit is a box joining with an invite, as enrollment and admission
// write it: the invite redeemed for enrollment, the agent key it is
// signed recorded (control/enroll answers the same), then the invite
// redeemed again for admission and the machine recorded
// (machines.Admit, what the admission service runs).
func (l *machineLedger) admit(ctx context.Context, s *store.Store, id string) (joined, error) {
	token, _, err := invites.Create(ctx, s, invites.Spec{})
	if err != nil {
		return joined{}, err
	}
	if _, err := invites.Redeem(ctx, s, token, id, store.InviteUseEnroll); err != nil {
		return joined{}, err
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	jwt, err := l.auth.SignUser(storagenode.CredsRequest{Role: storagenode.RoleAgent, Machine: id}, pub)
	if err != nil {
		return joined{}, err
	}
	rec, err := store.CredentialOfJWT(jwt, store.IssuedByEnrollment)
	if err != nil {
		return joined{}, err
	}
	if err := s.RecordCredential(ctx, rec); err != nil {
		return joined{}, err
	}
	n := l.n.Load()
	if _, err := machines.Admit(ctx, s, token, id, fmt.Sprintf("10.77.%d.%d", n/250, n%250+1)); err != nil {
		return joined{}, err
	}
	return joined{token: token, user: pub}, nil
}

// work admits machine after machine until the power goes; with remove,
// each is removed (`control machine rm --force`) right after.
func (l *machineLedger) work(remove bool) func(ctx context.Context, s *store.Store, _ *rand.Rand, ack func(func())) {
	return func(ctx context.Context, s *store.Store, _ *rand.Rand, ack func(func())) {
		for ctx.Err() == nil {
			id := fmt.Sprintf("box%05d", l.n.Add(1))
			j, err := l.admit(ctx, s, id)
			if err != nil {
				continue
			}
			ack(func() { l.mu.Lock(); l.admitted[id] = j; l.mu.Unlock() })
			if !remove {
				continue
			}
			l.mu.Lock()
			delete(l.admitted, id)
			l.removing[id] = j
			l.mu.Unlock()
			if _, err := machines.Remove(ctx, s, id, true, 20*time.Millisecond); err != nil {
				continue
			}
			ack(func() { l.mu.Lock(); delete(l.removing, id); l.removed[id] = j; l.mu.Unlock() })
		}
	}
}

// check holds the store to the ledger: an admitted machine's record and
// credentials are there and its invite admits no other machine; a
// removed machine is gone, its keys revoked, its invite void.
func (l *machineLedger) check(ctx context.Context, t *testing.T, s *store.Store, cut string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, j := range l.admitted {
		if _, _, err := s.GetMachine(ctx, id); err != nil {
			t.Errorf("%s: LOST: machine %s was admitted; its record: %v", cut, id, err)
		}
		if _, err := s.Credential(ctx, j.user); err != nil {
			t.Errorf("%s: LOST: machine %s's enrollment recorded key %s; now: %v", cut, id, j.user, err)
		}
		if _, err := machines.Admit(ctx, s, j.token, "other-"+id, "10.78.0.1"); err == nil {
			t.Errorf("%s: LOST: machine %s's invite was spent; after the cut it admitted another machine", cut, id)
		}
	}
	// A removal the cut interrupted is the operator's to run again (the
	// command failed): it must finish, whatever the cut left. The record
	// goes last, so a machine without one was removed in full (what is
	// checked of every removed machine below).
	// A lease the dead removal held (the mesh registrar's, 15 s) refuses
	// it busy until it expires: the operator tries again.
	for id, j := range l.removing {
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
			_, err = machines.Remove(ctx, s, id, true, 20*time.Millisecond)
			if !store.HasCode(err, store.CodeBusy) || time.Now().After(deadline) {
				break
			}
			l.busyRetries++
		}
		if err != nil && !store.HasCode(err, store.CodeNotFound) {
			t.Errorf("%s: machine %s's removal was interrupted by the cut; running `machine rm --force` again: %v", cut, id, err)
		}
		delete(l.removing, id)
		l.removed[id] = j
	}
	all, err := s.ListCredentials(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	creds := map[string][]store.IssuedCredential{}
	for _, c := range all {
		creds[c.Machine] = append(creds[c.Machine], c)
	}
	for id, j := range l.removed {
		if _, _, err := s.GetMachine(ctx, id); !store.HasCode(err, store.CodeNotFound) {
			t.Errorf("%s: LOST: machine %s was removed; its record after the cut: %v", cut, id, err)
		}
		for _, c := range creds[id] {
			if c.RevokedAt.IsZero() {
				t.Errorf("%s: LOST: machine %s was removed; its key %s is not revoked after the cut", cut, id, c.User)
			}
		}
		if _, err := machines.Admit(ctx, s, j.token, id, "10.78.0.2"); err == nil {
			t.Errorf("%s: LOST: machine %s was removed and its invite voided; after the cut the invite admitted it again", cut, id)
		}
	}
}

func newMachineLedger(t *testing.T) *machineLedger {
	auth, err := storagenode.LoadAuth(filepath.Join(t.TempDir(), "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	return &machineLedger{auth: auth, admitted: map[string]joined{}, removed: map[string]joined{}, removing: map[string]joined{}}
}

// Power cuts at random points of machine admission: every machine whose
// admission was acknowledged has its record and its enrollment's key
// after the cut, and its invite stays spent.
func TestCutsMachineAdmission(t *testing.T) {
	b := newBox(t)
	l := newMachineLedger(t)
	b.cutPower(t, scenario{cuts: 20, window: 300 * time.Millisecond, work: l.work(false), check: l.check})
	t.Logf("%d admissions acknowledged", len(l.admitted))
}

// Power cuts at random points of `control machine rm`: a removal
// acknowledged stays done (record gone, keys revoked, invite void).
func TestCutsMachineRemoval(t *testing.T) {
	b := newBox(t)
	l := newMachineLedger(t)
	b.cutPower(t, scenario{cuts: 20, window: 500 * time.Millisecond, work: l.work(true), check: l.check})
	t.Logf("%d removals acknowledged or finished after a cut (%d machines admitted, not removed yet); %d retries of `machine rm` refused busy by a lease the cut left held",
		len(l.removed), len(l.admitted), l.busyRetries)
}

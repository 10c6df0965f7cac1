package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/edgeplane/edgeplane/internal/version"
)

// Releases. A release is one version of the fleet's own binaries (control,
// the gateway's caddy, meshd) for one architecture. The binaries go into
// the release object store; the ReleaseRecord that names them with their
// sizes and SHA-256 digests is intent, signed like a deploy commit by a
// signer the trust root certified, and written once: a version, once
// pushed, is never replaced. A machine upgrading itself verifies the record
// and then every byte it downloads against it, so neither a writer to the
// object store nor anyone between it and the storage nodes can hand it a
// binary the operator did not push.

// ReleaseBinaryNames are the binaries a release may carry.
var ReleaseBinaryNames = []string{"control", "caddy", "meshd"}

// ReleaseRecord is one pushed release. Key: ReleaseKey(Release, Arch).
type ReleaseRecord struct {
	Version int `json:"version"`
	// Release is the binaries' version, MAJOR.MINOR.PATCH[-PRE]: what
	// they report (control version) once running.
	Release string `json:"release"`
	// Arch is GOOS/GOARCH, e.g. linux/amd64.
	Arch     string                   `json:"arch"`
	Binaries map[string]ReleaseBinary `json:"binaries"`
	PushedAt time.Time                `json:"pushed_at"`
	Notes    string                   `json:"notes,omitempty"`
}

func (r *ReleaseRecord) version() int { return r.Version }

// KeyOK checks that the record is filed under its release and arch.
func (r *ReleaseRecord) KeyOK(key string) error { return keyMust(key, ReleaseKey(r.Release, r.Arch)) }

// ReleaseBinary is one binary of a release, as stored.
type ReleaseBinary struct {
	// Object is its name in the release object store.
	Object string `json:"object"`
	Size   int64  `json:"size"`
	// SHA256 is the hex digest of its bytes.
	SHA256 string `json:"sha256"`
}

// ReleaseKey is the releases bucket key of release for arch.
func ReleaseKey(release, arch string) string {
	return strings.ReplaceAll(arch, "/", "_") + "." + release
}

// ValidateRelease checks a release's version and architecture.
func ValidateRelease(release, arch string) error {
	if _, err := version.Parse(release); err != nil {
		return Errorf(CodeInvalid, "%v", err).With("release", release)
	}
	goos, goarch, ok := strings.Cut(arch, "/")
	if !ok || !ValidToken(goos) || !ValidToken(goarch) {
		return Errorf(CodeInvalid, "architecture %q: want GOOS/GOARCH, e.g. linux/amd64", arch).With("arch", arch)
	}
	return nil
}

func (s *Store) releaseSubject(key string) string {
	return "$KV." + s.Names.ReleasesBucket() + "." + key
}

// PushRelease stores bins (name to reader) as release rel.Release for
// rel.Arch and then writes rel, signed, naming each with its size and
// digest. A release already pushed is refused (conflict): versions are
// immutable, push a new one.
func (s *Store) PushRelease(ctx context.Context, rel *ReleaseRecord, bins map[string]io.Reader) error {
	if err := ValidateRelease(rel.Release, rel.Arch); err != nil {
		return err
	}
	if len(bins) == 0 {
		return Errorf(CodeInvalid, "release %s has no binaries", rel.Release)
	}
	if s.signer == nil {
		// Refused before any binary is stored.
		return errSigningKeyRequired()
	}
	if _, err := s.Release(ctx, rel.Release, rel.Arch); err == nil {
		return Errorf(CodeConflict, "release %s for %s was pushed already; a version is never replaced, push a new one", rel.Release, rel.Arch).
			With("release", rel.Release).With("arch", rel.Arch)
	} else if !HasCode(err, CodeNotFound) {
		return err
	}
	obs, err := s.JS.ObjectStore(ctx, s.Names.ReleaseBinariesStore())
	if err != nil {
		return classify(fmt.Errorf("opening the release object store: %w", err))
	}
	rel.Version, rel.PushedAt = RecordVersion, time.Now().UTC()
	rel.Binaries = map[string]ReleaseBinary{}
	names := make([]string, 0, len(bins))
	for name := range bins {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !isReleaseBinary(name) {
			return Errorf(CodeInvalid, "release binary %q: want one of %s", name, strings.Join(ReleaseBinaryNames, ", "))
		}
		obj := strings.ReplaceAll(rel.Arch, "/", "_") + "/" + rel.Release + "/" + name
		h := sha256.New()
		info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: obj, Description: name + " " + rel.Release + " " + rel.Arch}, io.TeeReader(bins[name], h))
		if err != nil {
			return classify(fmt.Errorf("storing %s of release %s: %w", name, rel.Release, err))
		}
		rel.Binaries[name] = ReleaseBinary{Object: obj, Size: int64(info.Size), SHA256: hex.EncodeToString(h.Sum(nil))}
	}
	data, err := json.Marshal(rel)
	if err != nil {
		return err
	}
	key := ReleaseKey(rel.Release, rel.Arch)
	if _, err := s.appendSigned(ctx, s.signerKey(), "KV_"+s.Names.ReleasesBucket(), s.releaseSubject(key), "", data, "",
		jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		if errors.Is(err, errSubjectExpectation) {
			return Errorf(CodeConflict, "release %s for %s was pushed meanwhile", rel.Release, rel.Arch)
		}
		return classify(fmt.Errorf("writing release %s: %w", rel.Release, err))
	}
	return nil
}

func isReleaseBinary(name string) bool {
	for _, n := range ReleaseBinaryNames {
		if n == name {
			return true
		}
	}
	return false
}

// Release reads release for arch, verified: not_found when it was never
// pushed, bad_signature when its record does not verify under the trust
// root.
func (s *Store) Release(ctx context.Context, release, arch string) (*ReleaseRecord, error) {
	if err := ValidateRelease(release, arch); err != nil {
		return nil, err
	}
	var found *StoredMsg
	if err := s.LastOf(ctx, "KV_"+s.Names.ReleasesBucket(), []string{s.releaseSubject(ReleaseKey(release, arch))}, func(m *StoredMsg) error {
		found = m
		return nil
	}); err != nil {
		return nil, err
	}
	if found == nil {
		return nil, Errorf(CodeNotFound, "no release %s for %s (control release ls)", release, arch).With("release", release).With("arch", arch)
	}
	return s.VerifyRelease(ctx, found)
}

// VerifyRelease checks m, a message of the releases bucket, and returns its
// record: taken only under the key its subject names and only signed.
func (s *Store) VerifyRelease(ctx context.Context, m *StoredMsg) (*ReleaseRecord, error) {
	bucket := s.Names.ReleasesBucket()
	key := strings.TrimPrefix(m.Subject, "$KV."+bucket+".")
	if err := s.Verify(ctx, "KV_"+bucket, m); err != nil {
		return nil, refusedIntent("release "+key, err)
	}
	var rec ReleaseRecord
	if err := DecodeKeyed(bucket, key, m.Data, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// ListReleases lists every pushed release, newest version first; records
// that do not verify are returned apart, with why.
func (s *Store) ListReleases(ctx context.Context) (good []ReleaseRecord, bad []error, err error) {
	stream := "KV_" + s.Names.ReleasesBucket()
	subjects, err := s.SubjectsOf(ctx, stream, s.releaseSubject(">"))
	if err != nil {
		return nil, nil, err
	}
	err = s.LastOf(ctx, stream, subjects, func(m *StoredMsg) error {
		rec, err := s.VerifyRelease(ctx, m)
		if err != nil {
			bad = append(bad, err)
			return nil
		}
		good = append(good, *rec)
		return nil
	})
	sort.Slice(good, func(i, j int) bool {
		if good[i].Release != good[j].Release {
			return version.Older(good[j].Release, good[i].Release)
		}
		return good[i].Arch < good[j].Arch
	})
	return good, bad, err
}

// objectMeta is the part of the object store's meta record a reader needs
// (nats.go's ObjectInfo, as stored).
type objectMeta struct {
	NUID    string `json:"nuid"`
	Size    uint64 `json:"size"`
	Deleted bool   `json:"deleted,omitempty"`
}

// FetchReleaseBinary writes binary name of rel to w and checks it against
// rel: the size and the SHA-256 digest its signed record names. It reads
// with direct gets, as every role may (an edge box may create no consumer,
// which nats.go's object store reads need). A mismatch is bad_signature:
// the bytes are not what was signed, and w must be thrown away.
func (s *Store) FetchReleaseBinary(ctx context.Context, rel *ReleaseRecord, name string, w io.Writer) error {
	b, ok := rel.Binaries[name]
	if !ok {
		return Errorf(CodeNotFound, "release %s for %s has no %s", rel.Release, rel.Arch, name)
	}
	bucket := s.Names.ReleaseBinariesStore()
	stream := "OBJ_" + bucket
	var meta *StoredMsg
	metaSubj := "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(b.Object))
	if err := s.LastOf(ctx, stream, []string{metaSubj}, func(m *StoredMsg) error {
		meta = m
		return nil
	}); err != nil {
		return err
	}
	if meta == nil {
		return Errorf(CodeNotFound, "release %s: object %s is missing from the release store", rel.Release, b.Object)
	}
	var om objectMeta
	if err := json.Unmarshal(meta.Data, &om); err != nil || om.NUID == "" || om.Deleted {
		return Errorf(CodeNotFound, "release %s: object %s has no readable meta record", rel.Release, b.Object)
	}
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(w, h)}
	if _, err := s.ReadFrom(ctx, stream, 1, "$O."+bucket+".C."+om.NUID, func(m *StoredMsg) error {
		if cw.n+int64(len(m.Data)) > b.Size {
			return errTooLong
		}
		_, err := cw.Write(m.Data)
		return err
	}); err != nil && !errors.Is(err, errTooLong) {
		return fmt.Errorf("reading %s of release %s: %w", name, rel.Release, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if cw.n != b.Size || got != b.SHA256 {
		return (&Error{Code: CodeBadSignature, Message: fmt.Sprintf("%s of release %s: read %d bytes with SHA-256 %s, the signed release names %d bytes with %s",
			name, rel.Release, cw.n, got, b.Size, b.SHA256)}).With("reason", "digest_mismatch")
	}
	return nil
}

var errTooLong = errors.New("longer than the signed size")

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Rollout states.
const (
	RolloutRunning = "running"
	RolloutDone    = "done"
	RolloutFailed  = "failed"
)

// RolloutRecord is a fleet upgrade as the control client running it
// records it, for the dashboard and `control fleet versions`. Key: its ID.
// It is an account of progress, not intent: each machine's outcome is what
// its agent reports in its machine state.
type RolloutRecord struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Release string `json:"release"`
	Holder  string `json:"holder,omitempty"`
	State   string `json:"state"`
	// Phase is the phase under way (canary, batch N).
	Phase string `json:"phase,omitempty"`
	// Total machines asked or to be asked; Upgraded, Current and Skipped
	// count outcomes so far.
	Total    int `json:"total"`
	Upgraded int `json:"upgraded"`
	Current  int `json:"current"`
	Skipped  int `json:"skipped"`
	// FailedMachine and Reason say why a failed rollout stopped.
	FailedMachine string    `json:"failed_machine,omitempty"`
	Reason        string    `json:"reason,omitempty"`
	Started       time.Time `json:"started"`
	Updated       time.Time `json:"updated"`
}

func (r *RolloutRecord) version() int { return r.Version }

// KeyOK checks that the record is filed under its ID.
func (r *RolloutRecord) KeyOK(key string) error { return keyMust(key, r.ID) }

// PutRollout records a rollout's progress.
func (s *Store) PutRollout(ctx context.Context, r *RolloutRecord) error {
	r.Version, r.Updated = RecordVersion, time.Now().UTC()
	if _, err := PutJSON(ctx, s.rollouts, r.ID, r); err != nil {
		return fmt.Errorf("recording rollout %s: %w", r.ID, err)
	}
	return nil
}

// LatestRollout is the rollout started last; nil when there was none.
func (s *Store) LatestRollout(ctx context.Context) (*RolloutRecord, error) {
	var latest *RolloutRecord
	err := ListJSON(ctx, s, s.rollouts, ">", func(_ string, r *RolloutRecord) error {
		if latest == nil || r.Started.After(latest.Started) {
			latest = r
		}
		return nil
	})
	return latest, err
}

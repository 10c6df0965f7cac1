package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/system"
	"github.com/moby/moby/client"
)

// Labels every container the container driver starts carries: a restarted
// agent finds its containers by them, and a container with them that no
// agent knows is a stray.
const (
	LabelInstance  = "io.edgeplane.instance"
	LabelNamespace = "io.edgeplane.namespace"
	LabelService   = "io.edgeplane.service"
	LabelSlot      = "io.edgeplane.slot"
	LabelRevision  = "io.edgeplane.revision"
	LabelMachine   = "io.edgeplane.machine"
)

// Container runs instances as containers of an engine that speaks the
// Docker Engine API: Docker, or podman's compatible service. Containers
// use the host's network (an instance listens on HOST:PORT like a
// process), run without an engine restart policy (the agent heals), and
// are named edgeplane-<instance>.
type Container struct {
	c *client.Client
	// pumps copy containers' output into their log files until the
	// driver closes.
	pumps  context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// resolves shares image lookups between concurrent callers.
	resolves coalescer[*Image]
	// PollInterval is how often an instance is checked when the engine's
	// wait is not used (podman) or failed; default 500ms.
	PollInterval time.Duration
	// pollExits follows containers by inspecting them, not by a wait.
	pollExits bool
	// APIVersion is the Engine API version negotiated with the engine.
	APIVersion string
}

// DefaultEngineSockets are tried in order when no engine is named: Docker's,
// then podman's rootful service.
var DefaultEngineSockets = []string{"unix:///var/run/docker.sock", "unix:///run/podman/podman.sock"}

// ConnectEngine connects to the engine at host (a unix:// or tcp:// URL)
// and negotiates the API version; it fails if the engine does not answer.
func ConnectEngine(ctx context.Context, host string) (*Container, error) {
	c, err := client.New(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("container engine %s: %w", host, err)
	}
	p, err := c.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true})
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("container engine %s does not answer: %w", host, err)
	}
	pumps, cancel := context.WithCancel(context.Background())
	d := &Container{c: c, APIVersion: p.APIVersion, pumps: pumps, cancel: cancel}
	// podman's Docker-compatible wait polls the container without pause:
	// with podman 4.3.1, ten containers followed by waits kept its service
	// at 100% of a core (0% without), which every apply and every other
	// instance on the box paid for. Its containers are followed by
	// inspecting them every PollInterval instead.
	v, err := c.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("container engine %s: asking its version: %w", host, err)
	}
	d.pollExits = slices.ContainsFunc(v.Components, func(c system.ComponentVersion) bool { return c.Name == "Podman Engine" })
	return d, nil
}

// Close stops copying output and ends the driver's connections.
func (d *Container) Close() error {
	d.cancel()
	d.wg.Wait()
	return d.c.Close()
}

// Name is "container".
func (d *Container) Name() string { return "container" }

// ContainerName is the engine's name of instance id's container.
func ContainerName(id string) string { return "edgeplane-" + id }

// Image is an image as the engine has it.
type Image struct {
	// ID is the image's content address ("sha256:..."): what a deploy
	// pins and every start uses.
	ID          string   `json:"id"`
	RepoTags    []string `json:"repo_tags,omitempty"`
	RepoDigests []string `json:"repo_digests,omitempty"`
}

// ErrNoImage is an image the engine does not have and could not pull.
var ErrNoImage = errors.New("image not present")

// ResolveImage finds ref (a tag, name@digest, or an image ID) in the
// engine's image store; a ref it lacks is pulled first (an image ID is
// never pulled: it names content only a store can have).
//
// Calls for the same ref at the same time share one lookup: every agent of
// an apply asks at once, and an engine serves image lookups one at a time
// (ten at once on podman took ten times one). A call only shares a lookup
// that starts after it was made, never one already under way, so it still
// sees a tag moved just before it asked.
func (d *Container) ResolveImage(ctx context.Context, ref string) (*Image, error) {
	img, err := d.resolves.do(ctx, ref, d.resolveImage)
	if err != nil {
		return nil, err
	}
	// Each caller its own copy: they share the lookup, not what they do
	// with its answer.
	return &Image{ID: img.ID, RepoTags: slices.Clone(img.RepoTags), RepoDigests: slices.Clone(img.RepoDigests)}, nil
}

func (d *Container) resolveImage(ctx context.Context, ref string) (*Image, error) {
	ii, err := d.c.ImageInspect(ctx, ref)
	if errdefs.IsNotFound(err) && !isImageID(ref) {
		rc, perr := d.c.ImagePull(ctx, ref, client.ImagePullOptions{})
		if perr != nil {
			return nil, fmt.Errorf("%w: %s: pulling: %v", ErrNoImage, ref, perr)
		}
		werr := rc.Wait(ctx)
		_ = rc.Close()
		if werr != nil {
			return nil, fmt.Errorf("%w: %s: pulling: %v", ErrNoImage, ref, werr)
		}
		ii, err = d.c.ImageInspect(ctx, ref)
	}
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%w: %s", ErrNoImage, ref)
	}
	if err != nil {
		return nil, fmt.Errorf("inspecting image %s: %w", ref, err)
	}
	return &Image{ID: ii.ID, RepoTags: ii.RepoTags, RepoDigests: ii.RepoDigests}, nil
}

func isImageID(ref string) bool {
	const p = "sha256:"
	return len(ref) == len(p)+64 && ref[:len(p)] == p
}

// Start creates and starts the instance's container from spec.Image (an
// image ID, as a deploy pins it). spec.Command, if set, replaces the
// image's entrypoint and arguments. A container left by an earlier run of
// the same instance is removed and replaced.
func (d *Container) Start(ctx context.Context, spec Spec) (Handle, error) {
	if spec.Image == "" {
		return nil, fmt.Errorf("starting %s: no image", spec.ID)
	}
	name := ContainerName(spec.ID)
	env := instanceEnv(spec)[1:] // no PATH: the image has its own
	cfg := &container.Config{Image: spec.Image, Env: env, Labels: maps.Clone(spec.Labels)}
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels[LabelInstance] = spec.ID
	if len(spec.Command) > 0 {
		cfg.Entrypoint, cfg.Cmd = spec.Command[:1], spec.Command[1:]
	}
	hc := &container.HostConfig{
		NetworkMode:    "host",
		ReadonlyRootfs: spec.ReadOnlyRoot,
		Resources:      container.Resources{NanoCPUs: int64(spec.CPUs * 1e9), Memory: spec.Memory},
	}
	opts := client.ContainerCreateOptions{Name: name, Config: cfg, HostConfig: hc}
	created, err := d.c.ContainerCreate(ctx, opts)
	if err != nil && !errdefs.IsNotFound(err) {
		// A container left by an earlier run of the instance may hold the
		// name (Docker says 409, podman 4.3 only 500): removed, then
		// created again. Only then: removing what is not there would cost
		// every start a round trip to the engine.
		_, rerr := d.c.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true})
		switch {
		case rerr == nil:
			created, err = d.c.ContainerCreate(ctx, opts)
		case !errdefs.IsNotFound(rerr):
			return nil, fmt.Errorf("starting %s: creating its container: %w (removing an old one: %v)", spec.ID, err, rerr)
		}
	}
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("starting %s: %w: %s", spec.ID, ErrNoImage, spec.Image)
		}
		return nil, fmt.Errorf("starting %s: creating its container: %w", spec.ID, err)
	}
	if _, err := d.c.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		_, _ = d.c.ContainerRemove(context.WithoutCancel(ctx), created.ID, client.ContainerRemoveOptions{Force: true})
		return nil, fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	ins, err := d.c.ContainerInspect(ctx, created.ID, client.ContainerInspectOptions{})
	if err != nil {
		return nil, fmt.Errorf("starting %s: inspecting its container: %w", spec.ID, err)
	}
	st := State{ID: spec.ID, Driver: d.Name(), Container: created.ID}
	if ins.Container.State != nil {
		st.PID = ins.Container.State.Pid
	}
	if spec.LogDir != "" {
		if err := os.MkdirAll(spec.LogDir, 0o700); err != nil {
			return nil, fmt.Errorf("starting %s: %w", spec.ID, err)
		}
		st.LogPath = filepath.Join(spec.LogDir, spec.ID+".log")
		d.pumpLogs(st, time.Time{})
	}
	return d.follow(st), nil
}

// pumpLogs appends the container's output from since (zero: all of it) to
// st.LogPath until the container stops or the driver closes, so that
// output reads the same for containers and processes.
func (d *Container) pumpLogs(st State, since time.Time) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f, err := os.OpenFile(st.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return
		}
		defer f.Close()
		opts := client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Follow: true}
		if !since.IsZero() {
			opts.Since = strconv.FormatFloat(float64(since.UnixNano())/1e9, 'f', 9, 64)
		}
		rc, err := d.c.ContainerLogs(d.pumps, st.Container, opts)
		if err != nil {
			return
		}
		defer rc.Close()
		_, _ = stdcopy.StdCopy(f, f, rc)
	}()
}

// Adopt re-attaches to the container st names if it still runs.
func (d *Container) Adopt(ctx context.Context, st State) (Handle, error) {
	if st.Container == "" {
		return nil, fmt.Errorf("adopting %s: no container: %w", st.ID, ErrGone)
	}
	ins, err := d.c.ContainerInspect(ctx, st.Container, client.ContainerInspectOptions{})
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("adopting %s (container %.12s): %w", st.ID, st.Container, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("adopting %s: %w", st.ID, err)
	}
	if ins.Container.State == nil || !ins.Container.State.Running {
		return nil, fmt.Errorf("adopting %s (container %.12s): not running: %w", st.ID, st.Container, ErrGone)
	}
	if st.LogPath != "" {
		// Output from when the last copy stopped (a line at that very
		// moment may come twice).
		since := time.Now()
		if fi, err := os.Stat(st.LogPath); err == nil {
			since = fi.ModTime()
		}
		d.pumpLogs(st, since)
	}
	return d.follow(st), nil
}

// Stop stops the container (SIGTERM, SIGKILL after grace) and removes it.
func (d *Container) Stop(ctx context.Context, h Handle, grace time.Duration) error {
	id := h.State().Container
	secs := max(int(grace.Round(time.Second)/time.Second), 1)
	_, err := d.c.ContainerStop(ctx, id, client.ContainerStopOptions{Timeout: &secs})
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stopping %s: %w", h.State().ID, err)
	}
	// The engine answers a stop once the container has stopped: the run
	// has ended now, not when the engine's wait for it answers too (podman
	// took up to 440ms more to, ten stops at once).
	if r, ok := h.(*run); ok {
		r.finish(d.exitOf(ctx, id))
	}
	select {
	case <-h.Exited():
	case <-ctx.Done():
		return ctx.Err()
	}
	if _, err := d.c.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true}); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("removing the container of %s: %w", h.State().ID, err)
	}
	return nil
}

// Listed is a container with edgeplane's labels.
type Listed struct {
	Instance  string            `json:"instance"`
	Container string            `json:"container"`
	Running   bool              `json:"running"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// List returns every container carrying LabelInstance, running or not.
func (d *Container) List(ctx context.Context) ([]Listed, error) {
	res, err := d.c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelInstance)})
	if err != nil {
		return nil, fmt.Errorf("listing containers: %w", err)
	}
	var out []Listed
	for _, c := range res.Items {
		out = append(out, Listed{Instance: c.Labels[LabelInstance], Container: c.ID, Running: c.State == container.StateRunning, Labels: c.Labels})
	}
	slices.SortFunc(out, func(a, b Listed) int { return strings.Compare(a.Instance, b.Instance) })
	return out, nil
}

// follow returns a handle whose Exited closes when the container stops
// running: an engine wait, or polling where waits cost too much (podman)
// or the wait fails (the engine restarted, say).
func (d *Container) follow(st State) *run {
	h := newRun(st)
	go func() {
		ctx := context.Background()
		if !d.pollExits {
			w := d.c.ContainerWait(ctx, st.Container, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
			select {
			case <-w.Result:
				// Stop may have seen the end first and said how it ended.
				if running(h) {
					h.finish(d.exitOf(ctx, st.Container))
				}
				return
			case <-w.Error:
			}
		}
		every := d.PollInterval
		if every <= 0 {
			every = 500 * time.Millisecond
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-d.pumps.Done():
				return // the driver closed: a later one adopts the container
			}
			if !running(h) {
				return
			}
			ins, err := d.c.ContainerInspect(ctx, st.Container, client.ContainerInspectOptions{})
			if errdefs.IsNotFound(err) || (err == nil && (ins.Container.State == nil || !ins.Container.State.Running)) {
				h.finish(d.exitOf(ctx, st.Container))
				return
			}
		}
	}()
	return h
}

// running says whether r has not ended yet.
func running(r *run) bool {
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// exitOf describes how a container that stopped running ended.
func (d *Container) exitOf(ctx context.Context, id string) error {
	ins, err := d.c.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil || ins.Container.State == nil {
		return &Exit{}
	}
	s := ins.Container.State
	if s.OOMKilled {
		return &Exit{Known: true, Code: s.ExitCode, Signal: "KILL (out of memory)"}
	}
	if s.ExitCode > 128 && s.ExitCode < 160 {
		return &Exit{Known: true, Code: s.ExitCode, Signal: syscall.Signal(s.ExitCode - 128).String()}
	}
	return &Exit{Known: true, Code: s.ExitCode}
}

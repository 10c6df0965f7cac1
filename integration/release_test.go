package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A release before this tree is built from the repository's own history,
// as the fleets run it: its tagged commit checked out in a temporary
// worktree and built there with `make build`'s flags. The skew tests run
// it beside this tree's binaries: the previous release, or an older one by
// name (buildRelease).

// releasesFile, at the repository's top, lists the releases (tag and
// commit, oldest first): the one place a release's commit is written down,
// so that a clone without tags (CI often clones without them) still finds
// it. scripts/release-tag.sh adds to it.
const releasesFile = "RELEASES"

// release is one line of the releases file.
type release struct {
	tag, commit string
}

// version is what the release's binaries report: the tag without its v.
func (r release) version() string { return strings.TrimPrefix(r.tag, "v") }

// releaseBins are the binaries of a built release.
type releaseBins struct {
	release
	control, caddy, meshd string
	buildTime             time.Duration
}

// built holds the releases built in this run, by tag: each is built once,
// whichever tests ask for it, into bins.dir (TestMain removes it).
var built struct {
	mu sync.Mutex
	by map[string]*releaseBuild
}

// releaseBuild is one release's build, done once.
type releaseBuild struct {
	once sync.Once
	bins releaseBins
	err  error
}

// previousRelease builds (once) and returns the newest release before this
// tree. It fails the test, never skips it, when the release cannot be
// found: a skew test that quietly does not run tests nothing.
func previousRelease(t *testing.T) releaseBins {
	t.Helper()
	top, err := git("", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := previousOf(top)
	if err != nil {
		t.Fatalf("previous release: %v", err)
	}
	return buildRelease(t, rel.tag)
}

// buildRelease builds (once per run) and returns release tag, as the
// releases file names it. Like previousRelease it fails the test, never
// skips it, when the release cannot be found or built.
func buildRelease(t *testing.T, tag string) releaseBins {
	t.Helper()
	built.mu.Lock()
	if built.by == nil {
		built.by = map[string]*releaseBuild{}
	}
	b := built.by[tag]
	if b == nil {
		b = &releaseBuild{}
		built.by[tag] = b
	}
	built.mu.Unlock()
	b.once.Do(func() {
		b.bins, b.err = buildTag(tag, filepath.Join(bins.dir, "release-"+tag))
		if b.err == nil {
			// Once per run: what CI's budget pays for the old build.
			fmt.Fprintf(os.Stderr, "built release %s (%s) in %s\n", b.bins.tag, b.bins.commit[:12], b.bins.buildTime.Round(100*time.Millisecond))
		}
	})
	if b.err != nil {
		t.Fatalf("release %s: %v", tag, b.err)
	}
	return b.bins
}

// buildTag builds release tag's control, caddy and meshd into out.
func buildTag(tag, out string) (releaseBins, error) {
	top, err := git("", "rev-parse", "--show-toplevel")
	if err != nil {
		return releaseBins{}, err
	}
	rel, err := releaseOf(top, tag)
	if err != nil {
		return releaseBins{}, err
	}
	start := time.Now()
	tmp, err := os.MkdirTemp("", "edgeplane-"+rel.tag+"-")
	if err != nil {
		return releaseBins{}, err
	}
	tree := filepath.Join(tmp, "tree")
	defer os.RemoveAll(tmp)
	if _, err := git(top, "worktree", "add", "--detach", tree, rel.commit); err != nil {
		return releaseBins{}, err
	}
	// Removed even when a build fails: the worktree is registered in the
	// repository itself, which outlives the test.
	defer func() { _, _ = git(top, "worktree", "remove", "--force", tree) }()
	b := releaseBins{release: rel, control: filepath.Join(out, "control"), caddy: filepath.Join(out, "caddy"), meshd: filepath.Join(out, "meshd")}
	ldflags := "-X github.com/edgeplane/edgeplane/internal/version.Version=" + rel.version()
	for _, x := range []struct{ out, pkg string }{
		{b.control, "./control"},
		{b.caddy, "./caddymodule/cmd/caddy"},
		{b.meshd, "./meshd"},
	} {
		cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", x.out, x.pkg)
		cmd.Dir = tree
		if o, err := cmd.CombinedOutput(); err != nil {
			return releaseBins{}, fmt.Errorf("building %s of %s: %v\n%s", x.pkg, rel.tag, err, o)
		}
	}
	b.buildTime = time.Since(start)
	return b, nil
}

// readReleases reads the releases file of the repository at top.
func readReleases(top string) ([]release, error) {
	raw, err := os.ReadFile(filepath.Join(top, releasesFile))
	if err != nil {
		return nil, fmt.Errorf("reading the releases file: %w", err)
	}
	return parseReleases(raw)
}

// previousOf reads the releases file of the repository at top and returns the newest release whose
// code is not top's HEAD's own (the commit that records a release in the
// file changes nothing else), resolved to a commit in this clone: by its
// tag, else by the commit the file names.
func previousOf(top string) (release, error) {
	list, err := readReleases(top)
	if err != nil {
		return release{}, err
	}
	for i := len(list) - 1; i >= 0; i-- {
		r := list[i]
		if err := resolvable(top, r); err != nil {
			return release{}, err
		}
		if _, err := git(top, "diff", "--quiet", r.commit, "HEAD", "--", ".", ":(exclude)RELEASES"); err == nil {
			continue // HEAD is this release: the one before it is the previous
		}
		return r, nil
	}
	return release{}, fmt.Errorf("the releases file names no release before HEAD")
}

// releaseOf returns release tag as the releases file of the repository at
// top names it, resolvable in this clone.
func releaseOf(top, tag string) (release, error) {
	list, err := readReleases(top)
	if err != nil {
		return release{}, err
	}
	for _, r := range list {
		if r.tag == tag {
			return r, resolvable(top, r)
		}
	}
	return release{}, fmt.Errorf("the releases file names no release %s", tag)
}

// resolvable checks that r's commit is in the clone at top: by its tag,
// which must name the commit the releases file does, else by the commit.
func resolvable(top string, r release) error {
	byTag, tagErr := git(top, "rev-parse", "--verify", "--quiet", "refs/tags/"+r.tag+"^{commit}")
	switch {
	case tagErr == nil && byTag != r.commit:
		return fmt.Errorf("tag %s names %s, the releases file %s: a release tag never moves", r.tag, byTag, r.commit)
	case tagErr != nil:
		if _, err := git(top, "rev-parse", "--verify", "--quiet", r.commit+"^{commit}"); err != nil {
			return fmt.Errorf("neither tag %s nor its commit %s is in this clone (a shallow clone, or one without tags? git fetch --tags --unshallow)", r.tag, r.commit)
		}
	}
	return nil
}

// parseReleases reads "TAG COMMIT" lines, skipping comments and blanks.
func parseReleases(raw []byte) ([]release, error) {
	var list []release
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || !strings.HasPrefix(f[0], "v") || len(f[1]) != 40 {
			return nil, fmt.Errorf("releases file line %d: want \"vX.Y.Z <40-hex commit>\", got %q", n, line)
		}
		list = append(list, release{tag: f[0], commit: f[1]})
	}
	return list, sc.Err()
}

// git runs git in dir ("" for here) and returns its trimmed output.
func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// The previous release builds from the repository's history and reports
// its own version: the ground every skew test stands on.
func TestPreviousReleaseBuildsFromHistory(t *testing.T) {
	old := previousRelease(t)
	for bin, name := range map[string]string{old.control: "control", old.meshd: "meshd"} {
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), name+" "+old.version()+" ") {
			t.Fatalf("%s version: %v\n%s", bin, err, out)
		}
	}
	out, err := exec.Command(old.caddy, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy version: %v\n%s", err, out)
	}
	if wt, _ := git("", "worktree", "list"); strings.Contains(wt, "edgeplane-"+old.tag) {
		t.Fatalf("the release's worktree was left behind:\n%s", wt)
	}
	t.Logf("previous release %s (%s) built in %s", old.tag, old.commit[:12], old.buildTime.Round(100*time.Millisecond))
}

// The releases file finds the previous release, and one named, in a clone
// without tags (by its commit), and fails loudly, never quietly, where the commit is
// absent too (a shallow clone) or the tag names another commit.
func TestPreviousReleaseWithoutTagsShallowOrMoved(t *testing.T) {
	top, err := git("", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(top, releasesFile))
	if err != nil {
		t.Fatal(err)
	}
	list, err := parseReleases(raw)
	if err != nil || len(list) == 0 {
		t.Fatalf("releases file: %v %v", list, err)
	}
	dir := t.TempDir()
	clone := func(name string, args ...string) string { return cloneRepo(t, top, filepath.Join(dir, name), args...) }

	noTags := clone("no-tags", "--no-tags")
	if tags, _ := git(noTags, "tag", "-l"); tags != "" {
		t.Fatalf("the clone has tags: %s", tags)
	}
	want, err := previousOf(top)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := previousOf(noTags); err != nil || got != want {
		t.Fatalf("without tags: %+v %v, want %+v", got, err, want)
	}

	// A release asked for by name, the oldest listed, resolves the same
	// way; one the file does not list is an error, not the wrong build.
	if got, err := releaseOf(noTags, list[0].tag); err != nil || got != list[0] {
		t.Fatalf("release %s without tags: %+v %v", list[0].tag, got, err)
	}
	if _, err := releaseOf(top, "v0.0.0"); err == nil || !strings.Contains(err.Error(), "names no release v0.0.0") {
		t.Fatalf("a release the file does not list: %v", err)
	}

	shallow := clone("shallow", "--no-tags", "--depth", "1")
	if _, err := previousOf(shallow); err == nil || !strings.Contains(err.Error(), "neither tag") {
		t.Fatalf("a shallow clone without tags: %v", err)
	}

	moved := clone("moved")
	if _, err := git(moved, "tag", "-f", want.tag, "HEAD"); err != nil {
		t.Fatal(err)
	}
	if _, err := previousOf(moved); err == nil || !strings.Contains(err.Error(), "never moves") {
		t.Fatalf("a moved tag: %v", err)
	}
}

// cloneRepo clones the repository at top into to, HEAD checked out, with
// git clone's args.
func cloneRepo(t *testing.T, top, to string, args ...string) string {
	t.Helper()
	if _, err := git("", append(append([]string{"clone", "--quiet"}, args...), "file://"+top, to)...); err != nil {
		t.Fatal(err)
	}
	return to
}

// make release-tag (scripts/release-tag.sh), in a clone: tags HEAD and
// records it in a commit of its own, after which the previous release is
// still the one before (the record changes no code); does nothing run
// again; refuses a dirty tree, a tag that would move and an older
// version; leaves a development build untagged.
func TestReleaseTagScript(t *testing.T) {
	top, err := git("", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatal(err)
	}
	repo := cloneRepo(t, top, filepath.Join(t.TempDir(), "repo"))
	before, err := previousOf(repo)
	if err != nil {
		t.Fatal(err)
	}
	tagScript := func(version string) (string, error) {
		cmd := exec.Command(filepath.Join(repo, "scripts", "release-tag.sh"), version)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mustGit := func(args ...string) string {
		t.Helper()
		out, err := git(repo, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(repo, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	write("go.mod", "dirty")
	if out, err := tagScript("9.0.0"); err == nil || !strings.Contains(out, "uncommitted changes") {
		t.Fatalf("a dirty tree: %v\n%s", err, out)
	}
	mustGit("checkout", "--", "go.mod")
	if out, err := tagScript("0.0.1"); err == nil || !strings.Contains(out, "older than the newest release") {
		t.Fatalf("an older version: %v\n%s", err, out)
	}
	if out, err := tagScript("0.0.0-dev"); err != nil || !strings.Contains(out, "not tagged") || mustGit("tag", "-l", "v0.0.0-dev") != "" {
		t.Fatalf("a development build: %v\n%s", err, out)
	}

	released := mustGit("rev-parse", "HEAD")
	if out, err := tagScript("9.0.0"); err != nil {
		t.Fatalf("tagging 9.0.0: %v\n%s", err, out)
	}
	if typ := mustGit("cat-file", "-t", "v9.0.0"); typ != "tag" {
		t.Fatalf("v9.0.0 is a %s, want an annotated tag", typ)
	}
	if at := mustGit("rev-parse", "v9.0.0^{commit}"); at != released {
		t.Fatalf("v9.0.0 names %s, want the HEAD it was run on, %s", at, released)
	}
	recorded := mustGit("rev-parse", "HEAD")
	if mustGit("rev-parse", "HEAD^") != released || mustGit("diff", "--name-only", released, "HEAD") != "RELEASES" || mustGit("status", "--porcelain") != "" {
		t.Fatalf("the record is not one commit of RELEASES alone after the release:\n%s", mustGit("log", "--stat", "-2"))
	}
	if raw, _ := os.ReadFile(filepath.Join(repo, releasesFile)); !strings.HasSuffix(string(raw), "v9.0.0 "+released+"\n") {
		t.Fatalf("RELEASES:\n%s", raw)
	}
	if got, err := previousOf(repo); err != nil || got != before {
		t.Fatalf("right after tagging 9.0.0 the previous release is %+v (%v), want %+v still", got, err, before)
	}
	if out, err := tagScript("9.0.0"); err != nil || !strings.Contains(out, "nothing to do") || mustGit("rev-parse", "HEAD") != recorded {
		t.Fatalf("tagging 9.0.0 again: %v\n%s", err, out)
	}

	write("go.mod", "a change after the release\n")
	mustGit("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "after the release")
	if got, err := previousOf(repo); err != nil || got != (release{tag: "v9.0.0", commit: released}) {
		t.Fatalf("after a change the previous release is %+v (%v), want v9.0.0", got, err)
	}
	if out, err := tagScript("9.0.0"); err == nil || !strings.Contains(out, "never moves") {
		t.Fatalf("9.0.0 on another commit: %v\n%s", err, out)
	}
}

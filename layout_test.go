package edgeplane_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/edgeplane/edgeplane"

// goList runs `go list` with args in the module and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not on PATH: the layout checks read the package graph with `go list`")
	}
	out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// The binaries that run on every edge box are clients of the store: running
// a NATS server is a storage node's job (store/storagenode, control only).
func TestEdgeBinariesLinkNoNATSServer(t *testing.T) {
	for _, bin := range []string{"./caddymodule/cmd/caddy", "./meshd", "./dnsproj/cmd/edgeplane-dns"} {
		for _, dep := range goList(t, "-deps", bin) {
			if strings.HasPrefix(dep, "github.com/nats-io/nats-server/") || dep == module+"/store/storagenode" {
				t.Errorf("%s links %s", bin, dep)
			}
		}
	}
}

// adapterPart returns the part a Caddy adapter package belongs to (its top
// folder), or "" when pkg is not an adapter: adapters are the gateway's
// caddymodule/ and the caddy* packages under a part's folder.
func adapterPart(pkg string) string {
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return ""
	}
	elems := strings.Split(rel, "/")
	for _, e := range elems {
		if strings.HasPrefix(e, "caddy") {
			return elems[0]
		}
	}
	return ""
}

// The rule of the README's layout table: a part's core is Caddy-free; its
// Caddy modules are adapters over cores (and store), and no adapter imports
// another part's adapter. Only the root package, which registers them all,
// and the custom Caddy's main bring adapters of several parts together.
func TestCoresAreCaddyFreeAndAdaptersStayApart(t *testing.T) {
	for _, line := range goList(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if pkg == module || pkg == module+"/caddymodule/cmd/caddy" {
			continue
		}
		part := adapterPart(pkg)
		for _, imp := range imports {
			if part == "" && strings.HasPrefix(imp, "github.com/caddyserver/caddy/") && pkg != module+"/internal/adapttest" {
				t.Errorf("%s imports %s: Caddy belongs in an adapter (caddymodule/ or a caddy* package)", pkg, imp)
			}
			if p := adapterPart(imp); p != "" && p != part {
				t.Errorf("%s imports %s, the Caddy adapter of another part: depend on its core instead", pkg, imp)
			}
		}
	}
}

// Imports run downward only: store (the shared plumbing) and signing (what
// a signature covers, and the trust root's signers) sit at the bottom, so
// neither they nor their tests import a part above them; internal/ holds
// helpers every part may use, so it imports no part either.
func TestImportsRunDownward(t *testing.T) {
	parts := []string{"control", "meshd", "caddymodule", "dnsproj", "certs", "projection", "integration"}
	bottom := func(pkg string) bool {
		for _, p := range []string{"store", "signing", "internal"} {
			if pkg == module+"/"+p || strings.HasPrefix(pkg, module+"/"+p+"/") {
				return true
			}
		}
		return false
	}
	format := "{{.ImportPath}} {{join .Imports \" \"}} {{join .TestImports \" \"}} {{join .XTestImports \" \"}}"
	for _, line := range goList(t, "-f", format, "./...") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if !bottom(pkg) {
			continue
		}
		for _, imp := range imports {
			for _, part := range parts {
				if imp == module+"/"+part || strings.HasPrefix(imp, module+"/"+part+"/") {
					t.Errorf("%s imports %s: store, signing and internal sit below %s/", pkg, imp, part)
				}
			}
		}
	}
}

// signing is the bottom of the bottom: store imports it (every signed
// record), so it imports nothing of this project's; what keeps signers in
// the store (store/signers) sits beside store, not under signing.
func TestSigningImportsNoPart(t *testing.T) {
	format := "{{.ImportPath}} {{join .Imports \" \"}}"
	for _, line := range goList(t, "-f", format, "./signing/...") {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, module+"/") {
				t.Errorf("%s imports %s: signing sits below every package of this module", fields[0], imp)
			}
		}
	}
}

// One concern per file: no source file past 700 lines (wireguard-go's are
// up to about 540); a file that grows past it holds two concerns, to be
// split as Caddy's reverseproxy splits its health checks, hosts and
// streaming. Tests are exempt: a scenario reads best in one place.
func TestNoSourceFileOver700Lines(t *testing.T) {
	const limit = 700
	format := "{{.Dir}} {{join .GoFiles \" \"}}"
	for _, line := range goList(t, "-f", format, "./...") {
		fields := strings.Fields(line)
		for _, f := range fields[1:] {
			b, err := os.ReadFile(filepath.Join(fields[0], f))
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(b, []byte("\n")); n > limit {
				t.Errorf("%s: %d lines, more than %d: split it by concern", filepath.Join(fields[0], f), n, limit)
			}
		}
	}
}

// handlesStillExported are the fields of store.Store that hold a bucket or
// stream handle and stay exported, each with why. A field leaves the list
// when it is unexported (a gopls rename), which gopls allows once nothing
// outside store uses it: the test fails on an entry that is no longer
// exported, so the list never outlives its reason.
var handlesStillExported = map[string]string{}

// store keeps its buckets and streams to itself: every other part reads
// and writes them through typed methods (GetInstance, WatchMachineBeats,
// PutCertStatus, ...), so that keys, record layouts and revision rules
// live in one place. A test that plants or reads raw records (an attack
// with a role's real credentials, a storage node's permissions) binds the
// bucket by name with storetest.Bucket, as an attacker would.
func TestStoreExportsNoHandles(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("store", "store.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	handle := map[string]bool{"KeyValue": true, "Stream": true, "ObjectStore": true}
	exported := map[string]bool{}
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Store" {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		found = true
		for _, field := range st.Fields.List {
			sel, ok := field.Type.(*ast.SelectorExpr)
			if !ok || !handle[sel.Sel.Name] {
				continue
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "jetstream" {
				continue
			}
			// NC and JS, the connection and its JetStream API, are not
			// handles of one bucket or stream: they are of type
			// *nats.Conn and jetstream.JetStream, never matched here.
			for _, name := range field.Names {
				if !name.IsExported() {
					continue
				}
				exported[name.Name] = true
				if _, ok := handlesStillExported[name.Name]; !ok {
					t.Errorf("store.Store exports %s (jetstream.%s): give its users typed methods and unexport it", name.Name, sel.Sel.Name)
				}
			}
		}
		return false
	})
	if !found {
		t.Fatal("store/store.go declares no struct Store")
	}
	for name, why := range handlesStillExported {
		if !exported[name] {
			t.Errorf("store.Store no longer exports %s: drop it from handlesStillExported (%s)", name, why)
		}
	}
}

// store.Store's JS, the JetStream API, must not become the way around
// TestStoreExportsNoHandles: code outside store/ binds no bucket, stream
// or object store by name (tests may, through storetest.Bucket/Stream).
// A syntactic scan: a binding through another variable escapes it, and a
// reviewer does not.
func TestNoBindingByNameOutsideStore(t *testing.T) {
	binding := regexp.MustCompile(`\.JS\.(KeyValue|Stream|ObjectStore)\(`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == "store" || strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range bytes.Split(b, []byte("\n")) {
			if m := binding.Find(line); m != nil {
				t.Errorf("%s:%d: binds %s by name outside store: add a typed method to store", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

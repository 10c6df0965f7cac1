package edgeplane_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// control's package main is command-line wiring: flags, usage text and
// calls into the packages that do the work. What is not wiring (a status
// view, a table, a process's assembly, a rotation's steps) lives in a
// package under control/ with one job, so main stays under 2,500 lines; a
// command that pushes it past that carries logic to move out.
func TestControlMainIsWiring(t *testing.T) {
	const limit = 2500
	fields := strings.Fields(goList(t, "-f", "{{.Name}} {{.Dir}} {{join .GoFiles \" \"}}", "./control")[0])
	if fields[0] != "main" {
		t.Fatalf("./control is package %s, want main", fields[0])
	}
	total := 0
	for _, f := range fields[2:] {
		b, err := os.ReadFile(filepath.Join(fields[1], f))
		if err != nil {
			t.Fatal(err)
		}
		total += bytes.Count(b, []byte("\n"))
	}
	if total > limit {
		t.Errorf("control's package main is %d lines without its tests, more than %d: move what is not command-line wiring into a package under control/", total, limit)
	}
	t.Logf("control's package main: %d lines in %d files", total, len(fields)-2)
}

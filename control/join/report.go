package join

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// Print says what a join did, for the operator.
func (r *Record) Print(w io.Writer) {
	fmt.Fprintf(w, "joined as machine %s (roles %s), admitted at %s\n", r.Machine, strings.Join(r.Roles, ", "), r.Address)
	if r.MeshIP != "" {
		fmt.Fprintf(w, "mesh IP %s\n", r.MeshIP)
	}
	for _, f := range append(append([]string(nil), r.Files...), r.Replaced...) {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
}

// Print says what a leave did, and what it left for the operator to undo
// elsewhere.
func (l *Left) Print(w io.Writer) {
	for _, f := range l.Removed {
		fmt.Fprintf(w, "removed %s\n", f)
	}
	for _, f := range l.Restored {
		fmt.Fprintf(w, "restored the packaged %s\n", f)
	}
	switch {
	case l.MeshLeft:
		fmt.Fprintln(w, "meshd left the mesh: its peer record is gone")
	case l.MeshErr != nil:
		fmt.Fprintf(w, "meshd could not leave the mesh (%v): `control machine rm` removes its peer\n", l.MeshErr)
	}
}

// PrintNotUndone says what leaving machine m did not undo.
func PrintNotUndone(w io.Writer, m string) {
	fmt.Fprintf(w, "machine %s has left this box. Not undone:\n", m)
	fmt.Fprintf(w, "  - the control plane's records of %s: on the control plane, run `control machine rm %s` (records, routing, DNS name and mesh peer go, its credentials are revoked; --force if instances are still recorded on it)\n", m, m)
	fmt.Fprintf(w, "  - instances the agent started keep running here: drain the machine and apply again before leaving (`control machine drain %s`)\n", m)
	fmt.Fprintln(w, "  - the invite stays spent; the packages stay installed (`dpkg -P` removes them and their state)")
}

// RunOrSay runs a systemctl command line (StartCommand, StopCommand), or
// says it would where it must not (skip: --no-start, --no-stop) or cannot
// (no systemd).
func RunOrSay(ctx context.Context, w io.Writer, argv []string, skip bool) error {
	line := strings.Join(argv, " ")
	switch {
	case skip:
		fmt.Fprintf(w, "would run: %s\n", line)
		return nil
	case !SystemdRunning():
		fmt.Fprintf(w, "systemd is not running on this box; would run: %s\n", line)
		return nil
	}
	if err := Systemctl(ctx, argv); err != nil {
		return err
	}
	fmt.Fprintf(w, "ran: %s\n", line)
	return nil
}

package join

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// SystemdRunning says whether systemd manages this box: the check
// systemd's own sd_booted() makes. Where it does not (a container, a test
// machine), join and leave say which units they would start or stop and
// leave them alone.
func SystemdRunning() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// StartCommand is the command that enables and starts units.
func StartCommand(units []string) []string {
	return append([]string{"systemctl", "enable", "--now"}, units...)
}

// StopCommand is the command that stops and disables units.
func StopCommand(units []string) []string {
	return append([]string{"systemctl", "disable", "--now"}, units...)
}

// Systemctl runs a systemctl command line (StartCommand, StopCommand).
func Systemctl(ctx context.Context, argv []string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, out)
	}
	return nil
}

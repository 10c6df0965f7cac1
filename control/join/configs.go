package join

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
)

// natsFlag is the --nats flag and its value in an env file's arguments.
var natsFlag = regexp.MustCompile(`--nats[= ]\S+`)

// AgentEnv is the agent's env file env (the packaged one) with its
// AGENT_ARGS naming the storage nodes at url; every other line, and every
// other flag, as they were.
func AgentEnv(env []byte, url string) []byte {
	lines := bytes.Split(env, []byte("\n"))
	found := false
	for i, l := range lines {
		rest, ok := bytes.CutPrefix(l, []byte("AGENT_ARGS="))
		if !ok {
			continue
		}
		found = true
		if natsFlag.Match(rest) {
			rest = natsFlag.ReplaceAllLiteral(rest, []byte("--nats "+url))
		} else {
			rest = append([]byte("--nats "+url+" "), rest...)
		}
		lines[i] = append([]byte("AGENT_ARGS="), bytes.TrimSpace(rest)...)
	}
	out := bytes.Join(lines, []byte("\n"))
	if !found {
		if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n")) {
			out = append(out, '\n')
		}
		out = append(out, []byte("AGENT_ARGS=--nats "+url+"\n")...)
	}
	return out
}

// GatewayConfig is the packaged caddy.json cfg with the store's URL and
// the gateway's credentials in the two places that reach the store (the
// certificate storage and the edgeplane app), and the gateway named by its
// machine, the name its credentials report under.
func GatewayConfig(cfg map[string]any, url, creds, machine string) ([]byte, error) {
	apps, _ := cfg["apps"].(map[string]any)
	app, ok := apps["edgeplane"].(map[string]any)
	if !ok {
		return nil, store.Errorf(store.CodeInvalid, "caddy.json has no edgeplane app (apps.edgeplane): not the packaged gateway config")
	}
	app["nats_url"], app["creds_file"], app["gateway_name"] = url, creds, machine
	if st, ok := cfg["storage"].(map[string]any); ok && st["module"] == "edgeplane" {
		st["nats_url"], st["creds_file"] = url, creds
	}
	b, err := json.MarshalIndent(cfg, "", "\t")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// replaceConfig puts staged in place of dst, with dst's owner and mode,
// after keeping dst's packaged content in packaged (by base name) for
// leave to restore. A copy kept already (a config replaced before) is not
// overwritten: it is the packaged one.
func replaceConfig(staged, dst, packaged string) error {
	fi, err := os.Stat(dst)
	if err != nil {
		return fmt.Errorf("config %s: %w", dst, err)
	}
	orig, err := os.ReadFile(dst)
	if err != nil {
		return err
	}
	keep := filepath.Join(packaged, filepath.Base(dst))
	if _, err := os.Stat(keep); os.IsNotExist(err) {
		if err := writeLike(keep, orig, fi); err != nil {
			return fmt.Errorf("keeping the packaged %s: %w", dst, err)
		}
	}
	// The staging dir sits under the state dir (another file system than
	// /etc, maybe), so the new content is written beside dst and renamed.
	b, err := os.ReadFile(staged)
	if err != nil {
		return err
	}
	return writeLike(dst, b, fi)
}

// writeLike replaces path with data whole, with fi's mode and owner.
func writeLike(path string, data []byte, fi os.FileInfo) error {
	uid, gid := -1, -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		uid, gid = int(st.Uid), int(st.Gid)
	}
	if err := atomicfile.WriteOwned(path, data, fi.Mode().Perm(), uid, gid); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// writePrivate replaces path with data, mode 0600.
func writePrivate(path string, data []byte) error { return atomicfile.Write(path, data, 0o600) }

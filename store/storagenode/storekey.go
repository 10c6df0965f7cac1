package storagenode

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/edgeplane/edgeplane/internal/atomicfile"
	"github.com/edgeplane/edgeplane/store"
)

// Where the store key lives. The key encrypts a node's JetStream store at
// rest, so it must not sit beside that store: a copy of the data dir (a
// backup, a disk image, a volume snapshot) would carry what decrypts it.
// A node takes its key, in this order, from:
//
//  1. the file an operator names (control server --store-key FILE);
//  2. systemd's credentials: $CREDENTIALS_DIRECTORY/jetstream.key, when
//     the unit hands it one (LoadCredential=, LoadCredentialEncrypted=);
//  3. its auth dir's jetstream.key, where every key lived before: kept
//     working as it is (a store is never re-keyed behind anyone's back),
//     with a warning when the auth dir is inside the data dir (the
//     default DATA/auth);
//  4. its default place: the auth dir's jetstream.key when the auth dir
//     is outside the data dir (the key travels with it), else
//     DATA-keys/jetstream.key, beside the data dir and not in it. A new
//     key is made there.

// StoreKeyCredential is the store key's name among systemd's credentials
// and in an auth dir.
const StoreKeyCredential = authStoreKeyFile

// StoreKeyPlace is where a node's store key is, or goes.
type StoreKeyPlace struct {
	File string
	// Source says how File was found: "--store-key", "systemd
	// credential", "auth dir", "default".
	Source string
	// Warning is set when the key sits inside the data dir.
	Warning string
}

// DefaultStoreKeyFile is where a new store key goes for a node with
// dataDir and authDir (step 4 above).
func DefaultStoreKeyFile(dataDir, authDir string) string {
	if authDir != "" && (dataDir == "" || !within(authDir, dataDir)) {
		return filepath.Join(authDir, authStoreKeyFile)
	}
	return filepath.Join(filepath.Clean(dataDir)+"-keys", authStoreKeyFile)
}

// LocateStoreKey finds the store key of a node with dataDir and authDir;
// explicit is --store-key ("" none).
func LocateStoreKey(dataDir, authDir, explicit string) StoreKeyPlace {
	var p StoreKeyPlace
	switch {
	case explicit != "":
		p = StoreKeyPlace{File: explicit, Source: "--store-key"}
	case credentialFile() != "":
		p = StoreKeyPlace{File: credentialFile(), Source: "systemd credential"}
	case authDir != "" && exists(filepath.Join(authDir, authStoreKeyFile)):
		p = StoreKeyPlace{File: filepath.Join(authDir, authStoreKeyFile), Source: "auth dir"}
	default:
		p = StoreKeyPlace{File: DefaultStoreKeyFile(dataDir, authDir), Source: "default"}
	}
	if dataDir != "" && within(p.File, dataDir) {
		def := DefaultStoreKeyFile(dataDir, "")
		p.Warning = fmt.Sprintf("the store key %s is inside the data dir %s, beside the store it encrypts: a copy of the data dir decrypts itself. "+
			"Move it out: stop the node, `mv %s %s` (the node finds it there), or hand it to systemd as the credential %s (LoadCredential=%s:FILE), then start it again",
			p.File, dataDir, p.File, def, StoreKeyCredential, StoreKeyCredential)
	}
	return p
}

// credentialFile is systemd's credential for the store key, "" when the
// process was given none.
func credentialFile() string {
	dir := os.Getenv("CREDENTIALS_DIRECTORY")
	if dir == "" {
		return ""
	}
	f := filepath.Join(dir, StoreKeyCredential)
	if !exists(f) {
		return ""
	}
	return f
}

// readStoreKeyFile reads a store key, "" when the file is not there.
func readStoreKeyFile(file string) (string, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store key: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if len(key) < 32 {
		return "", fmt.Errorf("store key %s holds %d characters, want a key of at least 32", file, len(key))
	}
	return key, nil
}

// InitStoreKeyFile makes file hold a new store key (its dir made
// private if missing), unless it holds one already, and returns the key.
// A node must start with the key its store was written with: losing it
// loses the store.
func InitStoreKeyFile(file string) (string, error) {
	if key, err := readStoreKeyFile(file); err != nil || key != "" {
		return key, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return "", fmt.Errorf("store key: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	key := base64.RawURLEncoding.EncodeToString(raw[:])
	if err := atomicfile.Write(file, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("store key: %w", err)
	}
	return key, nil
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	ap, err1 := filepath.Abs(path)
	ad, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(ad, ap)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// BackupStoreKey is the store key a backup is sealed (or a restore
// opened) with: the one in file, else the one a node with dataDir finds
// where it would (LocateStoreKey). It is "" when neither is given, or the
// node has no key and its store is plaintext; an error when a key was
// named and is not there, or the node's store is encrypted and its key is
// not where the node would find it.
func BackupStoreKey(file, dataDir string) (string, error) {
	if file == "" && dataDir != "" {
		place := LocateStoreKey(dataDir, filepath.Join(dataDir, "auth"), "")
		if _, err := os.Stat(place.File); err != nil {
			layout, lerr := ReadStoreLayout(dataDir)
			if lerr == nil && layout.Encrypted {
				return "", store.Errorf(store.CodeNotFound, "the store in %s is encrypted at rest, but its key is not in %s: give --store-key FILE", dataDir, place.File).
					With("data", dataDir).With("store_key", place.File)
			}
			return "", nil // a node without a store key: its store is plaintext
		}
		file = place.File
	}
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the store key: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if len(key) < 32 {
		return "", store.Errorf(store.CodeInvalid, "%s holds no store key (want at least 32 characters)", file).With("store_key", file)
	}
	return key, nil
}

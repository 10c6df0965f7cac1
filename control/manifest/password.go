package manifest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/term"

	"github.com/edgeplane/edgeplane/store"
)

// The hashes a route's basic_auth holds (a manifest never holds a
// password) are made here, beside the rules that check them (auth.go), as
// the gateway's http_basic provider (Caddy's) reads them and with Caddy's
// own defaults: a hash made by `control hash-password` and one made by
// `caddy hash-password` cost the same to check.

// BcryptCost is Caddy's default bcrypt cost.
const BcryptCost = 14

// Caddy's argon2id defaults.
const (
	hashArgon2Time    = 1
	hashArgon2Memory  = 46 * 1024 // KiB
	hashArgon2Threads = 1
	hashArgon2KeyLen  = 32
	hashArgon2SaltLen = 16
)

// HashPasswordCommand is `control hash-password`: it reads the password
// from stdin (ReadPassword; prompts go to prompt) and prints its hash
// with algorithm to out.
func HashPasswordCommand(algorithm string, out, prompt io.Writer) error {
	if algorithm != "bcrypt" && algorithm != "argon2id" {
		return store.Errorf(store.CodeInvalid, "the algorithm must be bcrypt or argon2id, not %q", algorithm)
	}
	pw, err := ReadPassword(os.Stdin, prompt)
	if err != nil {
		return err
	}
	h, err := HashPassword(algorithm, pw)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, h)
	return err
}

// ReadPassword reads a password: from a terminal, prompted (on prompt)
// twice without echo; otherwise the first line of in. An empty one is
// refused.
func ReadPassword(in *os.File, prompt io.Writer) ([]byte, error) {
	var pw []byte
	if fd := int(in.Fd()); term.IsTerminal(fd) {
		fmt.Fprint(prompt, "Password: ")
		first, err := term.ReadPassword(fd)
		fmt.Fprintln(prompt)
		if err != nil {
			return nil, fmt.Errorf("reading the password: %w", err)
		}
		fmt.Fprint(prompt, "Again: ")
		again, err := term.ReadPassword(fd)
		fmt.Fprintln(prompt)
		if err != nil {
			return nil, fmt.Errorf("reading the password: %w", err)
		}
		if !bytes.Equal(first, again) {
			return nil, errors.New("the passwords differ")
		}
		pw = first
	} else {
		line, err := bufio.NewReader(in).ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("reading the password from stdin: %w", err)
		}
		pw = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	}
	if len(pw) == 0 {
		return nil, store.Errorf(store.CodeInvalid, "an empty password; give it on stdin or at the prompt")
	}
	return pw, nil
}

// HashPassword hashes pw with algorithm ("bcrypt" or "argon2id") as
// Caddy's hash modules do by default.
func HashPassword(algorithm string, pw []byte) (string, error) {
	switch algorithm {
	case "bcrypt":
		if len(pw) > 72 {
			return "", store.Errorf(store.CodeInvalid, "bcrypt reads at most 72 bytes of a password: use --algorithm argon2id for a longer one")
		}
		h, err := bcrypt.GenerateFromPassword(pw, BcryptCost)
		if err != nil {
			return "", fmt.Errorf("hashing the password: %w", err)
		}
		return string(h), nil
	case "argon2id":
		salt := make([]byte, hashArgon2SaltLen)
		if _, err := rand.Read(salt); err != nil {
			return "", fmt.Errorf("making a salt: %w", err)
		}
		key := argon2.IDKey(pw, salt, hashArgon2Time, hashArgon2Memory, hashArgon2Threads, hashArgon2KeyLen)
		return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, hashArgon2Memory, hashArgon2Time, hashArgon2Threads,
			base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
	}
	return "", store.Errorf(store.CodeInvalid, "the algorithm must be bcrypt or argon2id, not %q", algorithm)
}

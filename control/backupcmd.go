package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/edgeplane/edgeplane/control/storage"
	"github.com/edgeplane/edgeplane/store"
	"github.com/edgeplane/edgeplane/store/storagenode"
)

// storeKeyFlags find the store key a backup is sealed (or opened) with:
// the one the storage nodes encrypt the store with at rest.
type storeKeyFlags struct{ file, data string }

func addStoreKeyFlags(fs *flag.FlagSet) *storeKeyFlags {
	k := &storeKeyFlags{}
	fs.StringVar(&k.file, "store-key", "", "`FILE` of the store key (the one the storage nodes encrypt the store with): the backup is sealed with a key derived from it")
	fs.StringVar(&k.data, "data", "", "a storage node's data dir: its store key is found where the node finds it (--store-key, systemd's credential, DATA/auth, DATA-keys)")
	return k
}

// keyAndProgress is what a backup and a restore start with: the store key
// the flags name, and where progress lines go (nowhere under --json).
func (k *storeKeyFlags) keyAndProgress(c *call) (string, io.Writer, error) {
	key, err := storagenode.BackupStoreKey(k.file, k.data)
	if err != nil {
		return "", nil, err
	}
	if c.out.json {
		return key, io.Discard, nil
	}
	return key, c.out.w, nil
}

func setupStorageBackup(fs *flag.FlagSet) func(*call) error {
	k := addStoreKeyFlags(fs)
	plaintext := fs.Bool("plaintext", false, "write the backup in the clear although the store is encrypted at rest (default: refused without its store key)")
	return func(c *call) error {
		key, progress, err := k.keyAndProgress(c)
		if err != nil {
			return err
		}
		return c.withStore(func(s *store.Store) error {
			rep, err := storage.Backup(c.ctx, s, storage.BackupConfig{File: c.args[0], StoreKey: key, Plaintext: *plaintext, Progress: progress})
			if err != nil {
				return err
			}
			return c.out.emit(rep, func(w io.Writer) {
				how := "encrypted with a key derived from the store key: keep the key apart from the backups"
				if !rep.Encrypted {
					how = "NOT encrypted (no store key given: --store-key FILE or --data DIR seal it): it holds the store's secrets, certificates' private keys among them, in the clear"
				}
				fmt.Fprintf(w, "backup %s: %d streams and buckets, %d bytes, %s; %s\n", rep.File, len(rep.Streams), rep.Bytes, rep.Took.Round(time.Millisecond), how)
				if len(rep.Missing) > 0 {
					fmt.Fprintf(w, "not in this store (an older one), so not in the backup: %s\n", strings.Join(rep.Missing, ", "))
				}
			})
		})
	}
}

func setupStorageRestore(fs *flag.FlagSet) func(*call) error {
	k := addStoreKeyFlags(fs)
	replace := fs.Bool("replace", false, "delete streams and buckets that hold data of their own and put the backup's in their place (default: refuse, writing nothing)")
	return func(c *call) error {
		key, progress, err := k.keyAndProgress(c)
		if err != nil {
			return err
		}
		return c.withStore(func(s *store.Store) error {
			rep, err := storage.Restore(c.ctx, s, storage.RestoreConfig{File: c.args[0], StoreKey: key, Replace: *replace, Progress: progress})
			if err != nil {
				return err
			}
			return c.out.emit(rep, func(w io.Writer) {
				fmt.Fprintf(w, "restored %s (taken %s): %d streams and buckets restored, %d already, %d live ones skipped (their writers rebuild them), %s\n",
					rep.File, rep.Taken.Format(time.RFC3339), len(rep.Restored), len(rep.Already), len(rep.Skipped), rep.Took.Round(time.Millisecond))
				if len(rep.Replaced) > 0 {
					fmt.Fprintf(w, "replaced what was there in: %s\n", strings.Join(rep.Replaced, ", "))
				}
				fmt.Fprintln(w, "next: restart every `control server` (each certifies its signer again in the restored store); "+
					"the store is as it was when the backup was taken, and the fleet converges on it")
			})
		})
	}
}

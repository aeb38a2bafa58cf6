package deviceplugin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/rdmavisor/rdmavisor/internal/atomicfile"
)

// KeyFile is the node's allocation key, in the configuration's stateDir.
const KeyFile = "allocation-id.key"

// KeySize is the size of a Key in bytes.
const KeySize = 32

// Key is the node-local secret that allocation ids are derived with
// (KeyedID: the device plugin's AllocationID, the DRA driver's). Only root
// on the node and the process that keeps it know it, so no one else can
// tell an allocation's id, and the host path of its socket, from what is
// public about it (the devices a pod was given, a claim's UID).
type Key [KeySize]byte

// KeyedID is prefix and the first 16 bytes, in hex, of HMAC-SHA256 keyed
// by key of parts, each ended by a NUL (parts hold none, so the encoding
// of a list is unambiguous): the same for the same parts and key, and
// unpredictable without the key. An allocation id is a capability on the
// agent's socket paths; this is the one way they are made.
func KeyedID(key *Key, prefix string, parts ...string) string {
	mac := hmac.New(sha256.New, key[:])
	for _, p := range parts {
		mac.Write([]byte(p))
		mac.Write([]byte{0})
	}
	return prefix + hex.EncodeToString(mac.Sum(nil)[:16])
}

// AllocationID is the id of the allocation of a container's devices:
// "dp-" and the first 16 bytes of HMAC-SHA256, keyed by key, of the
// sorted device IDs. The same for the same set of IDs in any order and
// the same key, so a retried Allocate finds the allocation it made, and
// garbage collection can tell from a pod's devices which allocation is
// its; unpredictable without the key.
func AllocationID(key *Key, deviceIDs []string) string {
	ids := slices.Clone(deviceIDs)
	slices.Sort(ids)
	return KeyedID(key, allocPrefix, ids...) // device IDs hold no NUL
}

// LoadOrCreateKey returns the key in the file path, or, when there is no
// such file, makes one of KeySize random bytes (crypto/rand) and writes
// it there, mode 0600; created says which. The file appears whole or not
// at all (written aside, then linked in place), and of processes that
// race to create it, one wins and the others read its key.
//
// A file that is not KeySize bytes, not a regular file, not the caller's,
// or open to group or others is an error, never replaced: the ids of the
// allocations that running pods have mounted derive from the key, and a
// new key would give their allocations other ids (garbage collection
// would delete them, and re-create them where the pods do not look).
func LoadOrCreateKey(path string) (k Key, created bool, err error) {
	k, err = readKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Key{}, false, fmt.Errorf("allocation key: %w", err)
	}
	rand.Read(k[:]) // never fails: Go's crypto/rand crashes the program instead
	// Written aside and linked in place, which fails if a key another
	// process made in the meantime is there: that key is kept, and read.
	switch err := atomicfile.Create(path, k[:], 0o600); {
	case err == nil:
		return k, true, nil
	case errors.Is(err, fs.ErrExist):
		k, err := readKey(path)
		return k, false, err
	default:
		return Key{}, false, fmt.Errorf("allocation key: %w", err)
	}
}

// readKey reads the key file path; an error that wraps fs.ErrNotExist
// when there is none.
func readKey(path string) (Key, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return Key{}, fmt.Errorf("allocation key %s is a symbolic link: want a regular file", path)
		}
		return Key{}, fmt.Errorf("allocation key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Key{}, fmt.Errorf("allocation key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Key{}, fmt.Errorf("allocation key %s is not a regular file (%v)", path, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return Key{}, fmt.Errorf("allocation key %s is owned by uid %d, not this process's %d: anyone it belongs to can tell the allocations' ids", path, st.Uid, os.Geteuid())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return Key{}, fmt.Errorf("allocation key %s has mode %04o, want 0600: others may have read it and can tell the allocations' ids; "+
			"remove it for a new key (pods running on the node lose their allocations)", path, perm)
	}
	data, err := io.ReadAll(io.LimitReader(f, KeySize+1))
	if err != nil {
		return Key{}, fmt.Errorf("allocation key: %w", err)
	}
	if len(data) != KeySize {
		size := fmt.Sprintf("%d bytes", len(data))
		if len(data) > KeySize {
			size = fmt.Sprintf("more than %d bytes", KeySize)
		}
		return Key{}, fmt.Errorf("allocation key %s is damaged: %s, want %d; "+
			"remove it for a new key (pods running on the node lose their allocations)", path, size, KeySize)
	}
	return Key(data), nil
}

package deviceplugin

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// testKey is the key of the package's tests that do not read a file.
var testKey = Key{1, 2, 3}

func TestAllocationID(t *testing.T) {
	other := Key{4, 5, 6}
	a := AllocationID(&testKey, []string{"vconn-0002", "vconn-0001"})
	b := AllocationID(&testKey, []string{"vconn-0001", "vconn-0002"})
	c := AllocationID(&testKey, []string{"vconn-0001"})
	if a != b {
		t.Errorf("order matters: %s != %s", a, b)
	}
	if a == c {
		t.Errorf("different devices, same id %s", a)
	}
	if d := AllocationID(&other, []string{"vconn-0001", "vconn-0002"}); d == a {
		t.Errorf("another key, same id %s", a)
	}
	// Sets that concatenate alike are told apart.
	if x, y := AllocationID(&testKey, []string{"vconn-0001", "vconn-0002"}), AllocationID(&testKey, []string{"vconn-0001vconn-0002"}); x == y {
		t.Errorf("two sets, one id %s", x)
	}
	if len(a) > 63 || !allocID(a) {
		t.Errorf("bad id %q", a)
	}
	// What ids were before KeyedID was shared with the DRA driver: the
	// allocations running pods hold keep their ids across the upgrade.
	if got, want := AllocationID(&Key{1, 2, 3}, []string{"vconn-0002", "vconn-0001"}), "dp-9f98b9d2c431c14f0008c5ea2f2546a6"; got != want {
		t.Errorf("AllocationID = %s, want %s as before", got, want)
	}
}

// allocID: what the agent accepts (internal/agent's allocID), with our
// prefix and 32 hex digits.
func allocID(id string) bool {
	rest, ok := strings.CutPrefix(id, allocPrefix)
	return ok && len(rest) == 32 && strings.Trim(rest, "0123456789abcdef") == ""
}

// TestKeyFile: the key is made once, mode 0600, and read back unchanged
// by later calls (a restarted plugin), so ids survive restarts.
func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", KeyFile) // the directory is made too
	k1, created, err := LoadOrCreateKey(path)
	if err != nil || !created {
		t.Fatalf("LoadOrCreateKey = created %v, %v; want a new key", created, err)
	}
	if k1 == (Key{}) {
		t.Error("the new key is all zeros")
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o600 || fi.Size() != KeySize {
		t.Errorf("key file mode %v, %d bytes; want -rw------- and %d", fi.Mode(), fi.Size(), KeySize)
	}
	k2, created, err := LoadOrCreateKey(path)
	if err != nil || created || k2 != k1 {
		t.Errorf("second LoadOrCreateKey: created %v, same key %v, %v; want the first key", created, k2 == k1, err)
	}
	ents, err := os.ReadDir(filepath.Dir(path))
	if err != nil || len(ents) != 1 {
		t.Errorf("state directory holds %v (%v), want only the key", ents, err)
	}
	if other, _, err := LoadOrCreateKey(filepath.Join(t.TempDir(), KeyFile)); err != nil || other == k1 {
		t.Errorf("another node's key: same %v, %v", other == k1, err)
	}
}

// TestKeyFileRace: processes that start together agree on one key.
func TestKeyFileRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), KeyFile)
	const n = 16
	keys := make([]Key, n)
	made := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], made[i], errs[i] = LoadOrCreateKey(path) })
	}
	wg.Wait()
	creators := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("LoadOrCreateKey %d: %v", i, errs[i])
		}
		if keys[i] != keys[0] {
			t.Errorf("LoadOrCreateKey %d got another key", i)
		}
		if made[i] {
			creators++
		}
	}
	if creators != 1 {
		t.Errorf("%d callers created the key, want 1", creators)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("directory holds %v, want only the key (no temporary file left)", ents)
	}
}

// TestKeyFileRefused: a key file that is damaged or others may read is an
// error that says so, and is left alone: a new key would give running
// pods' allocations new ids.
func TestKeyFileRefused(t *testing.T) {
	good := make([]byte, KeySize)
	tests := []struct {
		name string
		data []byte
		mode os.FileMode
		want string
	}{
		{"empty", nil, 0o600, "damaged: 0 bytes, want 32"},
		{"short", good[:31], 0o600, "damaged: 31 bytes, want 32"},
		{"long", append(good, 0), 0o600, "damaged: more than 32 bytes"},
		{"readable by others", good, 0o644, "mode 0644, want 0600"},
		{"writable by the group", good, 0o620, "mode 0620, want 0600"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), KeyFile)
			if err := os.WriteFile(path, tt.data, tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			_, created, err := LoadOrCreateKey(path)
			if err == nil || created || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("LoadOrCreateKey: created %v, %v; want an error naming the file and %q", created, err, tt.want)
			}
			if got, _ := os.ReadFile(path); string(got) != string(tt.data) {
				t.Error("the file was changed")
			}
		})
	}
	t.Run("symbolic link", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "elsewhere")
		if err := os.WriteFile(target, good, 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, KeyFile)
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadOrCreateKey(path); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Fatalf("LoadOrCreateKey of a link: %v, want an error", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), KeyFile)
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, _, err := LoadOrCreateKey(path); err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("LoadOrCreateKey of a directory: %v, want an error", err)
		}
	})
}

// TestNewRefusesDamagedKey: the plugin does not start on a damaged key
// rather than make another one.
func TestNewRefusesDamagedKey(t *testing.T) {
	cfg := config.Default()
	cfg.StateDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(cfg.StateDir, KeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Config: cfg, Agent: newFakeAgent(t.TempDir(), 4)}); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("New: %v, want the damaged key's error", err)
	}
}

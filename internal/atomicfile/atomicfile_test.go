package atomicfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// leftovers lists the files in dir other than want.
func leftovers(t *testing.T, dir string, want ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !slices.Contains(want, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "10-net.conflist")
	cases := []struct {
		name string
		data []byte
		perm fs.FileMode
	}{
		{"new file", []byte("one"), 0o644},
		{"replaces, and takes the new mode", []byte("two, longer"), 0o600},
		{"empty", nil, 0o755},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := Write(p, c.data, c.perm); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, c.data) {
				t.Fatalf("read %q, %v; want %q", got, err, c.data)
			}
			fi, err := os.Stat(p)
			if err != nil || fi.Mode().Perm() != c.perm {
				t.Fatalf("mode %v, %v; want %v", fi.Mode().Perm(), err, c.perm)
			}
			if l := leftovers(t, dir, "10-net.conflist"); len(l) > 0 {
				t.Fatalf("temporary files left: %v", l)
			}
		})
	}
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	// The directory does not exist: no temporary file can be made.
	if err := Write(filepath.Join(dir, "no", "f"), []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Write into a missing directory: %v, want ErrNotExist", err)
	}
	// path is a non-empty directory: the rename fails, and the
	// temporary file goes.
	p := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(p, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("x"), 0o600); err == nil {
		t.Error("Write over a directory succeeded")
	}
	if l := leftovers(t, dir, "d"); len(l) > 0 {
		t.Errorf("temporary files left: %v", l)
	}
}

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	if err := Create(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want ErrExist", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "first" {
		t.Fatalf("file holds %q after a refused Create, want %q", got, "first")
	}
	if l := leftovers(t, dir, "key"); len(l) > 0 {
		t.Fatalf("temporary files left: %v", l)
	}
}

// TestCreateRace: of many creators of one path, exactly one wins, and the
// file holds its data whole.
func TestCreateRace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = Create(p, bytes.Repeat([]byte{byte('a' + i)}, 4096), 0o600)
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("creators %d and %d both succeeded", won, i)
		case err == nil:
			won = i
		case !errors.Is(err, fs.ErrExist):
			t.Fatalf("creator %d: %v", i, err)
		}
	}
	if won < 0 {
		t.Fatal("no creator succeeded")
	}
	got, _ := os.ReadFile(p)
	if want := bytes.Repeat([]byte{byte('a' + won)}, 4096); !bytes.Equal(got, want) {
		t.Fatalf("file is not the winner's data whole (%d bytes)", len(got))
	}
	if l := leftovers(t, dir, "key"); len(l) > 0 {
		t.Fatalf("temporary files left: %v", l)
	}
}

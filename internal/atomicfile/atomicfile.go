// Package atomicfile writes files that readers see whole or not at all:
// the data goes to a temporary file in the same directory, is synced, and
// is renamed (Write) or linked (Create) into place; the directory is then
// synced so the new name survives a crash.
//
// The temporary file is named ".BASE-DIGITS": hidden, and ending in
// digits, so a watcher that loads files by extension (a CNI runtime
// reading its configuration directory) never loads a half-written one.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, mode perm: a reader sees the old file or
// the new one, never a part.
func Write(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	syncDir(filepath.Dir(path))
	return nil
}

// Create writes path with data, mode perm, only if nothing is there: it
// returns an error matching fs.ErrExist if path exists, which it leaves
// alone. Of processes that race to create one path, exactly one succeeds,
// and the file the others find is whole.
func Create(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	// link(2), unlike rename(2), fails if path exists.
	if err := os.Link(tmp, path); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	syncDir(filepath.Dir(path))
	return nil
}

// writeTemp writes data to a new file beside path, mode perm, synced and
// closed, and returns its name; on error it leaves no file behind.
func writeTemp(path string, data []byte, perm fs.FileMode) (_ string, err error) {
	// CreateTemp opens with O_EXCL, mode 0600: nobody else can open the
	// file before it has its mode and contents.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Name(), nil
}

// syncDir makes a rename or link in dir durable. Best effort: the file is
// already in place, and some file systems refuse to sync a directory.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}

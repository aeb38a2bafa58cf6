package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// An application image (-single with -add) carries more than one static
// binary: an interpreter from the build host with the shared libraries it
// loads, its library directory, and the program's own files. -verify-app
// reads one back and checks that all it runs and loads is there.

// Add is a file or directory tree of the build host an image holds: Src on
// the host at Dst in the image; Dst "" keeps Src's path (symlinks on the
// way as symlinks, as the ibverbs agent's libraries are copied).
type Add struct{ Src, Dst string }

// ParseAdd parses -add's SRC or SRC=DST. A SRC kept at its own path, and
// every DST, is absolute.
func ParseAdd(s string) (Add, error) {
	src, dst, moved := strings.Cut(s, "=")
	switch {
	case src == "":
		return Add{}, fmt.Errorf("-add %q: no source path", s)
	case moved && (!path.IsAbs(dst) || path.Clean(dst) == "/"):
		return Add{}, fmt.Errorf("-add %q: the image path %q must be absolute, below /", s, dst)
	case !moved && !filepath.IsAbs(src):
		return Add{}, fmt.Errorf("-add %q: a host path kept in the image must be absolute (or say where: SRC=/DST)", s)
	case strings.ContainsRune(src, 0) || strings.ContainsRune(dst, 0):
		return Add{}, fmt.Errorf("-add %q: NUL in a path", s)
	}
	if moved {
		dst = path.Clean(dst)
	}
	return Add{Src: filepath.Clean(src), Dst: dst}, nil
}

// pruned says whether a file or directory named name is left out.
func pruned(name string, prune []string) bool {
	for _, p := range prune {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// isELF says whether the host file p (followed through symlinks) is an
// ELF file.
func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 4)
	n, _ := f.Read(b)
	return n == 4 && string(b) == elf.ELFMAG
}

// addTrees writes the adds to the layer, leaving out names that match a
// prune pattern, then the interpreters and libraries of every ELF file
// among them (HostDeps): an interpreter's extension modules, which it
// loads with dlopen, get theirs too.
func (w *layerWriter) addTrees(adds []Add, prune []string, arch string, done map[string]bool) error {
	var elfs []string
	for _, a := range adds {
		err := filepath.WalkDir(a.Src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if p != a.Src && pruned(d.Name(), prune) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if a.Dst == "" {
				if err := w.hostFile(p, done); err != nil {
					return err
				}
			} else if err := w.moved(a, p, d, done); err != nil {
				return err
			}
			if !d.IsDir() && isELF(p) {
				elfs = append(elfs, p)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("adding %s: %w", a.Src, err)
		}
	}
	deps, err := HostDeps(elfs, arch)
	if err != nil {
		return err
	}
	for _, f := range deps {
		if err := w.hostFile(f, done); err != nil {
			return fmt.Errorf("copying %s from this host: %w", f, err)
		}
	}
	return nil
}

// moved writes the host file p of a's tree at its place below a.Dst, with
// the directories above it.
func (w *layerWriter) moved(a Add, p string, d fs.DirEntry, done map[string]bool) error {
	rel, err := filepath.Rel(a.Src, p)
	if err != nil {
		return err
	}
	dst := strings.TrimPrefix(path.Join(a.Dst, filepath.ToSlash(rel)), "/")
	parts := strings.Split(dst, "/")
	for i := range parts[:len(parts)-1] {
		if dir := strings.Join(parts[:i+1], "/"); !done[dir] {
			done[dir] = true
			if err := w.dir(dir, 0o755, 0); err != nil {
				return err
			}
		}
	}
	if done[dst] {
		return nil
	}
	done[dst] = true
	switch {
	case d.IsDir():
		return w.dir(dst, 0o755, 0)
	case d.Type()&fs.ModeSymlink != 0:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: dst, Linkname: target,
			Mode: 0o777, ModTime: w.created, Format: tar.FormatPAX})
	case d.Type().IsRegular():
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return w.file(dst, int64(fi.Mode().Perm()), data)
	}
	return fmt.Errorf("%s: not a directory, file or symlink", p)
}

// VerifyApp checks an application image (-single, with or without -add)
// tagged tag in the tarball at path: its entrypoint is an executable file
// in the image; a script's interpreter (#!) is too; and every ELF file in
// the image finds its interpreter and libraries there.
func VerifyApp(path, tag string) error {
	cfg, files, err := Read(path, tag)
	if err != nil {
		return err
	}
	if len(cfg.Config.Entrypoint) == 0 {
		return errors.New("no entrypoint")
	}
	var errs []error
	exe := func(what, p string) (File, bool) {
		r := resolve(files, p)
		f := files[r]
		if r == "" || f.Dir || f.Mode&0o111 == 0 || len(f.Data) == 0 {
			errs = append(errs, fmt.Errorf("%s %s is not an executable file in the image", what, p))
			return f, false
		}
		return f, true
	}
	if f, ok := exe("entrypoint", cfg.Config.Entrypoint[0]); ok && bytes.HasPrefix(f.Data, []byte("#!")) {
		line, _, _ := bytes.Cut(f.Data[2:], []byte("\n"))
		if fields := strings.Fields(string(line)); len(fields) == 0 {
			errs = append(errs, fmt.Errorf("entrypoint %s: #! names no interpreter", cfg.Config.Entrypoint[0]))
		} else {
			exe("interpreter", fields[0])
		}
	}
	names := make([]string, 0, len(files))
	for p, f := range files {
		if !f.Dir && bytes.HasPrefix(f.Data, []byte(elf.ELFMAG)) {
			names = append(names, p)
		}
	}
	slices.Sort(names)
	seen := map[string]bool{}
	for _, p := range names {
		errs = append(errs, checkLoads(files, cfg.Architecture, p, files[p].Data, seen)...)
	}
	return errors.Join(errs...)
}

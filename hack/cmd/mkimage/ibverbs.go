package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The node agent in the image is built with cgo and -tags ibverbs: it
// loads libibverbs, which loads an rdma-core provider for the device
// (listed by the driver files in /etc/libibverbs.d). The image carries
// them, copied from the build host (ibverbs-providers), with the
// dynamic loader and every shared library they need. The other binaries
// stay static.

const (
	// IBVerbsAgent is the binary built with the ibverbs backend.
	IBVerbsAgent = "node-agent"
	driverDir    = "/etc/libibverbs.d"
)

// triplets maps GOARCH to the Debian multiarch directory name.
var triplets = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// libDirs are where the dynamic loader looks for a library without an
// ld.so.cache (the image has none): Debian's glibc searches its
// multiarch directories first.
func libDirs(arch string) []string {
	t := triplets[arch]
	return []string{"/lib/" + t, "/usr/lib/" + t, "/lib", "/usr/lib", "/lib64", "/usr/lib64"}
}

// providerDirs are where libibverbs looks for providers.
func providerDirs(arch string) []string {
	return []string{"/usr/lib/" + triplets[arch] + "/libibverbs", "/lib/" + triplets[arch] + "/libibverbs"}
}

// elfDeps returns an ELF file's interpreter (empty for a shared object or
// a static binary) and the libraries it needs (DT_NEEDED).
func elfDeps(data []byte) (interp string, needed []string, err error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", nil, fmt.Errorf("reading PT_INTERP: %w", err)
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	needed, err = f.ImportedLibraries()
	return interp, needed, err
}

// IBVerbsFiles lists the build host's files the ibverbs agent needs at run
// time: its interpreter and libraries, the providers found in the host's
// libibverbs directory and their libraries, transitively, and the driver
// files. Paths are as the loader names them (symlinks; Build copies what
// they point to as well).
func IBVerbsFiles(agent, arch string) ([]string, error) {
	if triplets[arch] == "" {
		return nil, fmt.Errorf("ibverbs files for GOARCH %s: unknown multiarch directory", arch)
	}
	drivers, _ := filepath.Glob(filepath.Join(driverDir, "*.driver"))
	var providers []string
	for _, d := range providerDirs(arch) {
		p, _ := filepath.Glob(filepath.Join(d, "lib*-rdmav*.so"))
		providers = append(providers, p...)
	}
	if len(drivers) == 0 || len(providers) == 0 {
		return nil, fmt.Errorf("no rdma-core providers on this host (%s: %d driver files, %d providers): install ibverbs-providers", driverDir, len(drivers), len(providers))
	}
	data, err := os.ReadFile(agent)
	if err != nil {
		return nil, err
	}
	if interp, _, err := elfDeps(data); err != nil {
		return nil, fmt.Errorf("%s: %w", agent, err)
	} else if interp == "" {
		return nil, fmt.Errorf("%s is not dynamically linked: build it with CGO_ENABLED=1 -tags ibverbs", agent)
	}
	deps, err := HostDeps(append([]string{agent}, providers...), arch)
	if err != nil {
		return nil, err
	}
	return append(append(slices.Clone(drivers), providers...), deps...), nil
}

// HostDeps returns what the build host's ELF files roots load: their
// interpreters and shared libraries, transitively, as the loader names
// them (symlinks; hostFile copies what they point to as well). A static
// binary loads nothing.
func HostDeps(roots []string, arch string) ([]string, error) {
	var files []string
	seen := map[string]bool{}
	queue := slices.Clone(roots)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		interp, needed, err := elfDeps(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if interp != "" && !seen[interp] {
			seen[interp] = true
			files = append(files, interp)
		}
		for _, n := range needed {
			lib := ""
			for _, d := range libDirs(arch) {
				if _, err := os.Stat(filepath.Join(d, n)); err == nil {
					lib = filepath.Join(d, n)
					break
				}
			}
			if lib == "" {
				return nil, fmt.Errorf("%s needs %s, which is not on this host", p, n)
			}
			if !seen[lib] {
				seen[lib] = true
				files = append(files, lib)
				queue = append(queue, lib)
			}
		}
	}
	return files, nil
}

// hostFile adds the host file p to the layer at the same path: each
// symlink on the way (a directory such as /lib -> usr/lib, or the file)
// as a symlink, and what it points to. done holds the paths added.
func (w *layerWriter) hostFile(p string, done map[string]bool) error {
	for hops := 0; hops < 40; hops++ {
		parts := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
		cur, next := "", ""
		for i, part := range parts {
			cur = path.Join(cur, part)
			fi, err := os.Lstat("/" + cur)
			if err != nil {
				return err
			}
			last := i == len(parts)-1
			switch {
			case fi.Mode()&os.ModeSymlink != 0:
				target, err := os.Readlink("/" + cur)
				if err != nil {
					return err
				}
				if !done[cur] {
					done[cur] = true
					if err := w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: cur, Linkname: target,
						Mode: 0o777, ModTime: w.created, Format: tar.FormatPAX}); err != nil {
						return err
					}
				}
				if !path.IsAbs(target) {
					target = path.Join("/", path.Dir(cur), target)
				}
				next = path.Join(append([]string{target}, parts[i+1:]...)...)
			case fi.IsDir():
				if !done[cur] {
					done[cur] = true
					if err := w.dir(cur, 0o755, 0); err != nil {
						return err
					}
				}
				if last {
					return nil
				}
				continue
			case fi.Mode().IsRegular() && last:
				if done[cur] {
					return nil
				}
				done[cur] = true
				data, err := os.ReadFile("/" + cur)
				if err != nil {
					return err
				}
				return w.file(cur, int64(fi.Mode().Perm()), data)
			default:
				return fmt.Errorf("%s: not a directory, file or symlink", "/"+cur)
			}
			break
		}
		p = next
	}
	return errors.New(p + ": too many symlinks")
}

// resolve follows the image's symlinks along p; "" when p is not there.
func resolve(files map[string]File, p string) string {
	for hops := 0; hops < 40; hops++ {
		parts := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
		cur := "/"
		linked := false
		for i, part := range parts {
			cur = path.Join(cur, part)
			f, ok := files[cur]
			if !ok {
				return ""
			}
			if f.Link != "" {
				t := f.Link
				if !path.IsAbs(t) {
					t = path.Join(path.Dir(cur), t)
				}
				p, linked = path.Join(append([]string{t}, parts[i+1:]...)...), true
				break
			}
		}
		if !linked {
			return cur
		}
	}
	return ""
}

// verifyIBVerbs checks that the image's node agent is built with the
// ibverbs backend and that all it loads is in the image: its interpreter
// and libraries, the driver files, and for each the provider with its
// libraries. Stand-ins that are not ELF files (the unit tests') are
// skipped.
func verifyIBVerbs(files map[string]File, arch string) []error {
	agent := files[binDir+"/"+IBVerbsAgent]
	if !bytes.HasPrefix(agent.Data, []byte(elf.ELFMAG)) {
		return nil
	}
	var errs []error
	seen := map[string]bool{}
	check := func(p string, data []byte, root bool) {
		if root {
			interp, needed, err := elfDeps(data)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p, err))
				return
			}
			if interp == "" || !slices.Contains(needed, "libibverbs.so.1") {
				errs = append(errs, fmt.Errorf("%s does not load libibverbs (interpreter %q, libraries %q): build it with CGO_ENABLED=1 -tags ibverbs", p, interp, needed))
				return
			}
		}
		errs = append(errs, checkLoads(files, arch, p, data, seen)...)
	}
	check(binDir+"/"+IBVerbsAgent, agent.Data, true)
	var drivers []string
	for p, f := range files {
		if path.Dir(p) == driverDir && strings.HasSuffix(p, ".driver") && !f.Dir {
			drivers = append(drivers, p)
		}
	}
	slices.Sort(drivers)
	for _, want := range []string{"rxe", "mlx5"} {
		if !slices.Contains(drivers, driverDir+"/"+want+".driver") {
			errs = append(errs, fmt.Errorf("%s/%s.driver is missing (have %q)", driverDir, want, drivers))
		}
	}
	for _, d := range drivers {
		name := strings.TrimSuffix(path.Base(d), ".driver")
		provider := ""
		for _, dir := range providerDirs(arch) {
			for p := range files {
				if path.Dir(p) == dir && strings.HasPrefix(path.Base(p), "lib"+name+"-rdmav") && strings.HasSuffix(p, ".so") {
					provider = p
				}
			}
		}
		r := resolve(files, provider)
		if provider == "" || r == "" {
			errs = append(errs, fmt.Errorf("%s: no provider lib%s-rdmav*.so in the image", d, name))
			continue
		}
		if !seen[r] {
			seen[r] = true
			check(provider, files[r].Data, false)
		}
	}
	return errs
}

// checkLoads checks that the image's ELF file p (contents data) finds its
// interpreter and libraries in the image, transitively; seen holds the
// libraries checked already.
func checkLoads(files map[string]File, arch, p string, data []byte, seen map[string]bool) []error {
	interp, needed, err := elfDeps(data)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", p, err)}
	}
	var errs []error
	if interp != "" {
		if r := resolve(files, interp); r == "" || files[r].Dir {
			errs = append(errs, fmt.Errorf("%s: its interpreter %s is not in the image", p, interp))
		}
	}
	for _, n := range needed {
		found := ""
		for _, d := range libDirs(arch) {
			if r := resolve(files, path.Join(d, n)); r != "" && !files[r].Dir {
				found = r
				break
			}
		}
		if found == "" {
			errs = append(errs, fmt.Errorf("%s needs %s, which is not in the image", p, n))
			continue
		}
		if !seen[found] {
			seen[found] = true
			errs = append(errs, checkLoads(files, arch, found, files[found].Data, seen)...)
		}
	}
	return errs
}

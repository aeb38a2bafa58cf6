// Package cdispec writes the Container Device Interface specs that put an
// agent allocation into a container: its socket directory mounted
// read-only and the pod protocol's environment. Container runtimes with
// CDI (containerd 1.7 and later, CRI-O) apply a spec when the kubelet
// names its device, whether a device plugin's Allocate or a DRA driver's
// prepared claim names it. Each allocation has a transient spec of its
// own, written atomically (tags.cncf.io/container-device-interface) and
// removed when the allocation goes.
//
// A spec's file name holds its device's name, the allocation id, which is
// a capability on the agent's socket paths: the directory is DirMode and
// the specs FileMode, for root only (the container runtime reads them as
// root). Write and Names tighten a directory found open to others (the
// kubelet makes a hostPath DirectoryOrCreate 0755).
package cdispec

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultDir is where runtimes look for transient (dynamic) specs.
const DefaultDir = "/var/run/cdi"

// DirMode and FileMode are the modes of the spec directory and of the
// specs: no one but root lists the allocation ids or reads the specs.
const (
	DirMode  fs.FileMode = 0o700
	FileMode fs.FileMode = 0o600
)

// Mount is a bind mount of a host path into the container.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

// Edits are what a device puts into a container. Annotations are the
// device's CDI annotations: the runtime passes them on to no container,
// so a writer may keep there what it needs to read back (Read).
type Edits struct {
	Env         map[string]string
	Mounts      []Mount
	Annotations map[string]string
}

// Specs are the transient specs of one CDI kind ("rdmavisor.io/vconn")
// in Dir, one file per device.
type Specs struct {
	Dir  string
	Kind string
}

// New checks the kind ("vendor/class") and returns the specs of it in dir
// (empty: DefaultDir).
func New(dir, kind string) (Specs, error) {
	if dir == "" {
		dir = DefaultDir
	}
	if _, _, _, err := parser.ParseQualifiedName(kind + "=x"); err != nil {
		return Specs{}, fmt.Errorf("cdi: kind %q: %w", kind, err)
	}
	return Specs{Dir: dir, Kind: kind}, nil
}

// Device is the fully qualified CDI name of device name: "<kind>=<name>",
// as the kubelet hands it to the runtime.
func (s Specs) Device(name string) string { return s.Kind + "=" + name }

// prefix starts the file name of every spec of the kind.
func (s Specs) prefix() string {
	vendor, class := parser.ParseQualifier(s.Kind)
	return cdi.GenerateTransientSpecName(vendor, class, "")
}

// file is the base name, without extension, of device name's spec.
func (s Specs) file(name string) string { return s.prefix() + name }

// Write writes (or replaces) the spec of device name. A container that
// names the device gets e.
func (s Specs) Write(name string, e Edits) error {
	if err := parser.ValidateDeviceName(name); err != nil {
		return fmt.Errorf("cdi: device %q: %w", name, err)
	}
	var edits specs.ContainerEdits
	for _, k := range slices.Sorted(maps.Keys(e.Env)) {
		edits.Env = append(edits.Env, k+"="+e.Env[k])
	}
	for _, m := range e.Mounts {
		// A unix socket needs neither exec nor device files.
		opts := []string{"bind", "nosuid", "nodev", "noexec"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		edits.Mounts = append(edits.Mounts, &specs.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: opts})
	}
	raw := &specs.Spec{Kind: s.Kind, Devices: []specs.Device{{Name: name, Annotations: e.Annotations, ContainerEdits: edits}}}
	// The oldest version that holds the spec: runtimes built with an
	// older CDI library accept it too.
	v, err := cdi.MinimumRequiredVersion(raw)
	if err != nil {
		return fmt.Errorf("cdi: spec of %s: %w", name, err)
	}
	raw.Version = v
	if err := os.MkdirAll(s.Dir, DirMode); err != nil {
		return fmt.Errorf("cdi: writing the spec of %s: %w", name, err)
	}
	if err := s.tighten(); err != nil {
		return fmt.Errorf("cdi: writing the spec of %s: %w", name, err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(s.Dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("cdi: %s: %w", s.Dir, err)
	}
	if err := cache.WriteSpec(raw, s.file(name)+".json"); err != nil {
		return fmt.Errorf("cdi: writing the spec of %s: %w", name, err)
	}
	// The library writes FileMode (a temporary file renamed); this holds
	// whatever it does.
	if err := os.Chmod(filepath.Join(s.Dir, s.file(name)+".json"), FileMode); err != nil {
		return fmt.Errorf("cdi: the spec of %s: %w", name, err)
	}
	return nil
}

// tighten takes group and others' access off Dir, which must be a
// directory; an error if it is not, or cannot be changed.
func (s Specs) tighten() error {
	fi, err := os.Stat(s.Dir)
	if err != nil {
		return err // names the directory
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%v)", s.Dir, fi.Mode().Type())
	}
	if fi.Mode().Perm()&^DirMode == 0 {
		return nil
	}
	if err := os.Chmod(s.Dir, fi.Mode().Perm()&DirMode); err != nil {
		return fmt.Errorf("%s has mode %04o, open to others, and cannot be made %04o: %w", s.Dir, fi.Mode().Perm(), DirMode, err)
	}
	return nil
}

// Read reads back the spec of device name as Write wrote it.
func (s Specs) Read(name string) (Edits, error) {
	spec, err := cdi.ReadSpec(filepath.Join(s.Dir, s.file(name)+".json"), 0)
	if err != nil {
		return Edits{}, fmt.Errorf("cdi: reading the spec of %s: %w", name, err)
	}
	d := spec.GetDevice(name)
	if d == nil {
		return Edits{}, fmt.Errorf("cdi: the spec of %s has no such device", name)
	}
	e := Edits{Annotations: d.Annotations}
	for _, kv := range d.ContainerEdits.Env {
		k, v, _ := strings.Cut(kv, "=")
		if e.Env == nil {
			e.Env = make(map[string]string)
		}
		e.Env[k] = v
	}
	for _, m := range d.ContainerEdits.Mounts {
		e.Mounts = append(e.Mounts, Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: slices.Contains(m.Options, "ro")})
	}
	return e, nil
}

// Remove removes the spec of device name; a missing one is no error.
func (s Specs) Remove(name string) error {
	err := os.Remove(filepath.Join(s.Dir, s.file(name)+".json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi: removing the spec of %s: %w", name, err)
	}
	return nil
}

// Names lists the devices of the kind that have a spec in Dir, sorted. A
// missing Dir has none. Dir is tightened first: listing is what a writer
// does as it starts (its sync), so one found open is closed then, before
// anything is written.
func (s Specs) Names() ([]string, error) {
	err := s.tighten()
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cdi: listing the specs: %w", err)
	}
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("cdi: listing %s: %w", s.Dir, err)
	}
	var names []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), s.prefix())
		if !ok {
			continue
		}
		if name, ok := strings.CutSuffix(rest, ".json"); ok && parser.ValidateDeviceName(name) == nil {
			names = append(names, name)
		}
	}
	return names, nil
}

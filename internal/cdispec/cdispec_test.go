package cdispec_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/rdmavisor/rdmavisor/internal/cdispec"
)

// A spec written here is what a runtime's CDI cache injects: the mount
// and the environment, under the qualified name; removing it takes the
// device away.
func TestWriteInjectRemove(t *testing.T) {
	dir := t.TempDir()
	s, err := cdispec.New(dir, "rdmavisor.io/vconn")
	if err != nil {
		t.Fatal(err)
	}
	e := cdispec.Edits{
		Env:    map[string]string{"RDMAVISOR_SOCKET": "/var/run/rdmavisor/agent.sock", "RDMAVISOR_VCONNS": "3"},
		Mounts: []cdispec.Mount{{HostPath: "/run/rdmavisor/alloc/dp-1", ContainerPath: "/var/run/rdmavisor", ReadOnly: true}},
	}
	for _, name := range []string{"dp-1", "dp-2"} {
		if err := s.Write(name, e); err != nil {
			t.Fatal(err)
		}
	}
	// Writing again replaces: one file per device.
	if err := s.Write("dp-1", e); err != nil {
		t.Fatal(err)
	}
	if names, err := s.Names(); err != nil || !slices.Equal(names, []string{"dp-1", "dp-2"}) {
		t.Fatalf("Names = %v, %v", names, err)
	}
	// What Write wrote reads back, annotations included.
	e.Annotations = map[string]string{"rdmavisor.io/pod": "default/p"}
	if err := s.Write("dp-2", e); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Read("dp-2"); err != nil || !reflect.DeepEqual(got, e) {
		t.Errorf("Read = %+v, %v; want %+v", got, err, e)
	}
	if _, err := s.Read("dp-9"); err == nil || !strings.Contains(err.Error(), "dp-9") {
		t.Errorf("Read of a missing spec: %v", err)
	}
	if dev := s.Device("dp-1"); dev != "rdmavisor.io/vconn=dp-1" {
		t.Errorf("Device = %q", dev)
	}

	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("the runtime's cache finds errors: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/bin"}}}
	if unresolved, err := cache.InjectDevices(spec, s.Device("dp-1")); err != nil {
		t.Fatalf("InjectDevices: %v (unresolved %v)", err, unresolved)
	}
	for _, env := range []string{"RDMAVISOR_SOCKET=/var/run/rdmavisor/agent.sock", "RDMAVISOR_VCONNS=3"} {
		if !slices.Contains(spec.Process.Env, env) {
			t.Errorf("env %v lacks %s", spec.Process.Env, env)
		}
	}
	if len(spec.Mounts) != 1 || spec.Mounts[0].Source != "/run/rdmavisor/alloc/dp-1" || spec.Mounts[0].Destination != "/var/run/rdmavisor" ||
		!slices.Contains(spec.Mounts[0].Options, "ro") || !slices.Contains(spec.Mounts[0].Options, "bind") {
		t.Errorf("mounts %+v", spec.Mounts)
	}

	if err := s.Remove("dp-1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("dp-1"); err != nil {
		t.Errorf("removing twice: %v", err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(&oci.Spec{Process: &oci.Process{}}, s.Device("dp-1")); err == nil {
		t.Error("a removed device still injects")
	}
	if names, err := s.Names(); err != nil || !slices.Equal(names, []string{"dp-2"}) {
		t.Fatalf("Names after Remove = %v, %v", names, err)
	}
}

// Another kind's specs and stray files are not ours; a missing directory
// lists nothing.
func TestNames(t *testing.T) {
	dir := t.TempDir()
	s, _ := cdispec.New(dir, "rdmavisor.io/vconn")
	other, _ := cdispec.New(dir, "rdmavisor.io/vconn-ib")
	if err := other.Write("dp-9", cdispec.Edits{Env: map[string]string{"A": "b"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rdmavisor.io-vconn_dp-3.yaml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if names, err := s.Names(); err != nil || len(names) != 0 {
		t.Fatalf("Names = %v, %v; want none", names, err)
	}
	missing, _ := cdispec.New(filepath.Join(dir, "nope"), "rdmavisor.io/vconn")
	if names, err := missing.Names(); err != nil || len(names) != 0 {
		t.Fatalf("Names of a missing dir = %v, %v", names, err)
	}
}

// Bad kinds and device names are refused with the reason.
func TestBadInput(t *testing.T) {
	for _, kind := range []string{"vconn", "rdmavisor.io/", "/vconn", "rdma visor.io/vconn"} {
		if _, err := cdispec.New(t.TempDir(), kind); err == nil || !strings.Contains(err.Error(), "kind") {
			t.Errorf("New(%q): %v", kind, err)
		}
	}
	s, _ := cdispec.New(t.TempDir(), "rdmavisor.io/vconn")
	for _, name := range []string{"", "a/b", "../x", "a b"} {
		if err := s.Write(name, cdispec.Edits{}); err == nil || !strings.Contains(err.Error(), "device") {
			t.Errorf("Write(%q): %v", name, err)
		}
	}
}

// mode is path's permission bits.
func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestModes: the spec files' names are allocation ids, capabilities on
// the agent's socket paths: the directory Write makes is 0700 and its
// specs 0600 (figures asserted), a directory found 0755 (the kubelet's
// DirectoryOrCreate) is made 0700 by Names, as a writer starts, and by
// Write, and a spec found 0644 is 0600 once written again.
func TestModes(t *testing.T) {
	e := cdispec.Edits{Env: map[string]string{"RDMAVISOR_VCONNS": "1"}}
	fresh := filepath.Join(t.TempDir(), "cdi")
	s, err := cdispec.New(fresh, "rdmavisor.io/vconn")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write("dp-1", e); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(fresh, "rdmavisor.io-vconn_dp-1.json")
	if m := mode(t, fresh); m != 0o700 {
		t.Errorf("the spec directory Write made has mode %04o, want 0700", m)
	}
	if m := mode(t, spec); m != 0o600 {
		t.Errorf("a spec has mode %04o, want 0600", m)
	}

	// Found open to others, as an older version or the kubelet left it.
	if err := os.Chmod(fresh, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if names, err := s.Names(); err != nil || !slices.Equal(names, []string{"dp-1"}) {
		t.Fatalf("Names = %v, %v", names, err)
	}
	if m := mode(t, fresh); m != 0o700 {
		t.Errorf("a spec directory of mode 0755 after Names: %04o, want 0700", m)
	}
	if err := os.Chmod(fresh, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.Write("dp-1", e); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, fresh); m != 0o700 {
		t.Errorf("a spec directory of mode 0755 after Write: %04o, want 0700", m)
	}
	if m := mode(t, spec); m != 0o600 {
		t.Errorf("a spec of mode 0644 written again: %04o, want 0600", m)
	}

	// A file where the directory should be: a clear error, the file kept.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad, err := cdispec.New(notDir, "rdmavisor.io/vconn")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Names(); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Names with a file for the directory: %v, want 'not a directory'", err)
	}
	if err := bad.Write("dp-1", e); err == nil {
		t.Error("Write with a file for the directory: no error")
	}
	if b, err := os.ReadFile(notDir); err != nil || string(b) != "x" || mode(t, notDir) != 0o644 {
		t.Errorf("the file in the directory's place was changed: %q, %v, mode %04o", b, err, mode(t, notDir))
	}
}

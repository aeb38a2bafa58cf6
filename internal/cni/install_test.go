package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/rdmavisor/rdmavisor/internal/atomicfile"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

var testEntry = Entry{Type: PluginType, AdminSocket: "/var/run/rdmavisor/admin.sock", FailurePolicy: FailOpen}

// installDir makes a CNI conf dir holding testdata/src as name (plus a later
// configuration that must never be touched), and a bin dir.
func installDir(t *testing.T, src, name string) (*Installer, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", src))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf, bin := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin")
	for _, d := range []string{conf, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	later, _ := os.ReadFile(filepath.Join("testdata", "cilium.conflist"))
	if err := os.WriteFile(filepath.Join(conf, "99-later.conflist"), later, 0o644); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, "plugin-binary")
	if err := os.WriteFile(binary, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &Installer{ConfDir: conf, BinDir: bin, Binary: binary, Entry: testEntry}, data
}

// snapshot is every file of a directory with its bytes.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

func pluginsOf(t *testing.T, data []byte) []map[string]any {
	t.Helper()
	var l struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	return l.Plugins
}

func TestInstallUninstall(t *testing.T) {
	for _, src := range []string{"bridge.conflist", "calico.conflist", "cilium.conflist"} {
		t.Run(src, func(t *testing.T) {
			in, orig := installDir(t, src, "10-primary.conflist")
			later := snapshot(t, in.ConfDir)["99-later.conflist"]
			path, err := in.Install()
			if err != nil {
				t.Fatal(err)
			}
			if want := filepath.Join(in.ConfDir, "10-primary.conflist"); path != want {
				t.Fatalf("installed into %s, want %s", path, want)
			}
			first, _ := os.ReadFile(path)
			// What the runtime would load: the original plugins, then ours, once.
			list, err := libcni.ConfListFromBytes(first)
			if err != nil {
				t.Fatalf("libcni cannot load the installed conflist: %v\n%s", err, first)
			}
			got, want := pluginsOf(t, first), pluginsOf(t, orig)
			if len(got) != len(want)+1 || len(list.Plugins) != len(got) {
				t.Fatalf("installed %d plugins, want %d + 1:\n%s", len(got), len(want), first)
			}
			for i := range want {
				wb, _ := json.Marshal(want[i])
				gb, _ := json.Marshal(got[i])
				if !bytes.Equal(wb, gb) {
					t.Errorf("plugin %d changed: %s, want %s", i, gb, wb)
				}
			}
			last := got[len(got)-1]
			if last["type"] != PluginType || last["adminSocket"] != testEntry.AdminSocket || last["failurePolicy"] != string(FailOpen) {
				t.Errorf("last plugin %v, want the rdmavisor-cni entry", last)
			}
			if b, _ := os.ReadFile(filepath.Join(in.BinDir, PluginType)); string(b) != "#!/bin/true\n" {
				t.Errorf("binary not installed: %q", b)
			}

			// Twice is once.
			before := snapshot(t, in.ConfDir)
			if _, err := in.Install(); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(t, in.ConfDir); !maps.Equal(before, after) {
				t.Errorf("a second install changed the configuration:\n%v\n%v", before, after)
			}

			if err := in.Uninstall(); err != nil {
				t.Fatal(err)
			}
			want2 := map[string]string{"10-primary.conflist": string(orig), "99-later.conflist": later}
			if got := snapshot(t, in.ConfDir); !maps.Equal(got, want2) {
				t.Errorf("after uninstall the conf dir holds %v, want the original bytes %v", got, want2)
			}
			if _, err := os.Stat(filepath.Join(in.BinDir, PluginType)); !os.IsNotExist(err) {
				t.Errorf("binary still installed: %v", err)
			}
			// Uninstalling again is harmless.
			if err := in.Uninstall(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestInstallConvertsSingleConf(t *testing.T) {
	in, orig := installDir(t, "flannel.conf", "10-flannel.conf")
	path, err := in.Install()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(in.ConfDir, "10-flannel.conflist"); path != want {
		t.Fatalf("installed into %s, want %s", path, want)
	}
	files := slices.Sorted(maps.Keys(snapshot(t, in.ConfDir)))
	if want := []string{StateFile, "10-flannel.conflist", "99-later.conflist"}; !slices.Equal(files, want) {
		t.Fatalf("conf dir holds %v, want %v", files, want)
	}
	data, _ := os.ReadFile(path)
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatalf("libcni cannot load the converted conflist: %v\n%s", err, data)
	}
	if list.Name != "cbr0" || list.CNIVersion != "0.4.0" || len(list.Plugins) != 2 ||
		list.Plugins[0].Network.Type != "flannel" || list.Plugins[1].Network.Type != PluginType {
		t.Fatalf("converted conflist: %s", data)
	}
	if _, err := in.Install(); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, data) {
		t.Errorf("a second install changed the conflist")
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	got := snapshot(t, in.ConfDir)
	if len(got) != 2 || got["10-flannel.conf"] != string(orig) {
		t.Errorf("after uninstall: %v, want 10-flannel.conf restored and nothing else", slices.Sorted(maps.Keys(got)))
	}
}

func TestInstallRefuses(t *testing.T) {
	for _, src := range []string{"malformed.conflist", "duplicate-key.conflist", "old-version.conflist", "no-type.conflist", "unknown-version.conflist"} {
		t.Run(src, func(t *testing.T) {
			in, _ := installDir(t, src, "10-primary.conflist")
			before := snapshot(t, in.ConfDir)
			_, err := in.Install()
			if !errors.Is(err, ErrNotUnderstood) {
				t.Fatalf("install: %v, want ErrNotUnderstood", err)
			}
			if !strings.Contains(err.Error(), "refusing to change") || !strings.Contains(err.Error(), "10-primary.conflist") {
				t.Errorf("error %q does not say which file it refused", err)
			}
			if after := snapshot(t, in.ConfDir); !maps.Equal(before, after) {
				t.Errorf("a refused install changed the conf dir:\n%v\n%v", before, after)
			}
		})
	}
	t.Run("symlink", func(t *testing.T) {
		in, _ := installDir(t, "bridge.conflist", "50-real.conflist")
		if err := os.Symlink("50-real.conflist", filepath.Join(in.ConfDir, "10-link.conflist")); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, in.ConfDir)
		if _, err := in.Install(); !errors.Is(err, ErrNotUnderstood) {
			t.Fatalf("install: %v, want ErrNotUnderstood", err)
		}
		if after := snapshot(t, in.ConfDir); !maps.Equal(before, after) {
			t.Errorf("a refused install changed the conf dir")
		}
	})
	t.Run("conversion target taken", func(t *testing.T) {
		in, _ := installDir(t, "flannel.conf", "10-flannel.conf")
		if err := os.WriteFile(filepath.Join(in.ConfDir, "10-flannel.conflist"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, in.ConfDir)
		if _, err := in.Install(); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Fatalf("install: %v, want a refusal", err)
		}
		if after := snapshot(t, in.ConfDir); !maps.Equal(before, after) {
			t.Errorf("a refused install changed the conf dir")
		}
	})
	t.Run("empty dir", func(t *testing.T) {
		in := &Installer{ConfDir: t.TempDir(), BinDir: t.TempDir(), Entry: testEntry}
		if _, err := in.Install(); !errors.Is(err, ErrNoConfig) {
			t.Fatalf("install: %v, want ErrNoConfig", err)
		}
	})
}

// TestInstallUpdatesEntry: a changed configuration updates the one entry;
// uninstall still restores the original bytes.
func TestInstallUpdatesEntry(t *testing.T) {
	in, orig := installDir(t, "calico.conflist", "10-calico.conflist")
	if _, err := in.Install(); err != nil {
		t.Fatal(err)
	}
	in.Entry.FailurePolicy = FailClosed
	path, err := in.Install()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	got := pluginsOf(t, data)
	if len(got) != 4 || got[3]["failurePolicy"] != string(FailClosed) {
		t.Fatalf("updated conflist: %s", data)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, orig) {
		t.Errorf("uninstall did not restore the original bytes:\n%s", b)
	}
}

// TestUninstallAfterRewrite: when the primary CNI rewrote the conflist
// after install (keeping the entry), uninstall removes only the entry.
func TestUninstallAfterRewrite(t *testing.T) {
	in, _ := installDir(t, "calico.conflist", "10-calico.conflist")
	path, err := in.Install()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	var l map[string]any
	if err := json.Unmarshal(data, &l); err != nil {
		t.Fatal(err)
	}
	l["name"] = "rewritten"
	rewritten, _ := json.Marshal(l)
	if err := os.WriteFile(path, rewritten, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(path)
	list, err := libcni.ConfListFromBytes(after)
	if err != nil {
		t.Fatal(err)
	}
	types := []string{}
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	if list.Name != "rewritten" || !slices.Equal(types, []string{"calico", "portmap", "bandwidth"}) {
		t.Errorf("after uninstall: name %q, plugins %v", list.Name, types)
	}
	if _, err := os.Stat(filepath.Join(in.ConfDir, StateFile)); !os.IsNotExist(err) {
		t.Errorf("state file left: %v", err)
	}
}

// TestInstallAfterPrimaryRewrite: the primary CNI replaced the conflist
// (dropping the entry); install adds it again and uninstall restores the
// new original.
func TestInstallAfterPrimaryRewrite(t *testing.T) {
	in, _ := installDir(t, "calico.conflist", "10-calico.conflist")
	path, err := in.Install()
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := os.ReadFile(filepath.Join("testdata", "bridge.conflist"))
	if err := os.WriteFile(path, fresh, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Install(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if got := pluginsOf(t, data); len(got) != 4 || got[3]["type"] != PluginType {
		t.Fatalf("reinstalled conflist: %s", data)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, fresh) {
		t.Errorf("uninstall did not restore the rewritten original:\n%s", b)
	}
}

func TestEntryFor(t *testing.T) {
	cfg := config.Default()
	e, err := EntryFor(cfg, FailClosed)
	if err != nil {
		t.Fatal(err)
	}
	if e != (Entry{Type: PluginType, AdminSocket: config.DefaultAdminSocket, FailurePolicy: FailClosed}) {
		t.Errorf("entry %+v", e)
	}
	cfg.AdminSocket = "/run/elsewhere/admin.sock"
	if _, err := EntryFor(cfg, FailOpen); err == nil || !strings.Contains(err.Error(), "not inside socketDir") {
		t.Errorf("admin socket outside socketDir: %v", err)
	}
	if _, err := EntryFor(config.Default(), "fail-sometimes"); err == nil {
		t.Error("bad policy accepted")
	}
}

// TestInstallConcurrent: installers racing on one node (two init
// containers) leave one entry, and uninstall still restores the original.
func TestInstallConcurrent(t *testing.T) {
	in, orig := installDir(t, "bridge.conflist", "10-bridge.conflist")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			c := *in
			_, err := c.Install()
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	data, _ := os.ReadFile(filepath.Join(in.ConfDir, "10-bridge.conflist"))
	if got := pluginsOf(t, data); len(got) != 4 {
		t.Fatalf("after concurrent installs: %s", data)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(in.ConfDir, "10-bridge.conflist")); !bytes.Equal(b, orig) {
		t.Errorf("uninstall did not restore the original bytes:\n%s", b)
	}
}

// TestInstallWhenReady waits for the primary configuration to appear.
func TestInstallWhenReady(t *testing.T) {
	in, orig := installDir(t, "cilium.conflist", "05-cilium.conflist")
	for _, f := range []string{"05-cilium.conflist", "99-later.conflist"} {
		if err := os.Remove(filepath.Join(in.ConfDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := in.InstallWhenReady(ctx, 5*time.Millisecond); !errors.Is(err, ErrNoConfig) {
		t.Fatalf("with no configuration: %v, want ErrNoConfig", err)
	}
	time.AfterFunc(50*time.Millisecond, func() {
		// Atomically, as the primary CNI's installer should.
		_ = atomicfile.Write(filepath.Join(in.ConfDir, "05-cilium.conflist"), orig, 0o644)
	})
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path, err := in.InstallWhenReady(ctx, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if got := pluginsOf(t, data); len(got) != 2 || got[1]["type"] != PluginType {
		t.Fatalf("installed: %s", data)
	}
}

// TestKeep: the sidecar mode repairs an installation the primary CNI or an
// operator undid, and leaves the node as it found it when stopped.
func TestKeep(t *testing.T) {
	in, orig := installDir(t, "bridge.conflist", "10-primary.conflist")
	want := snapshot(t, in.ConfDir)
	primary := filepath.Join(in.ConfDir, "10-primary.conflist")
	bin := filepath.Join(in.BinDir, PluginType)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Keep(ctx, 10*time.Millisecond) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the first install", in.chained)
	// The primary CNI rewrites its file without our entry.
	if err := os.WriteFile(primary, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the entry chained again", in.chained)
	// Someone removes the binary.
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	waitFor("the binary back", func() bool { _, err := os.Stat(bin); return err == nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, in.ConfDir); !maps.Equal(got, want) {
		t.Errorf("after Keep stopped the conf dir holds %v, want %v", got, want)
	}
	if _, err := os.Stat(bin); !os.IsNotExist(err) {
		t.Errorf("binary left behind: %v", err)
	}
}

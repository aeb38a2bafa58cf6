package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeBinaries writes a small stand-in for each binary: the test checks the
// image's layout, not the programs (hack/images.sh builds the real ones and
// runs -verify on the result).
func fakeBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!binary "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestBuildWriteRead(t *testing.T) {
	const tag = "local.test/rdmavisor:test"
	created := time.Unix(1700000000, 0).UTC()
	img, err := Build(Options{BinDir: fakeBinaries(t), RootFS: "../../image", Arch: "amd64", Version: "test", Created: created})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := Write(img, tag, out); err != nil {
		t.Fatal(err)
	}
	if err := Verify(out, tag); err != nil {
		t.Fatalf("Verify: %v", err)
	}

	cfg, files, err := Read(out, tag)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/rdmavisor"}) || c.Cmd != nil {
		t.Errorf("entrypoint %q cmd %q", c.Entrypoint, c.Cmd)
	}
	if c.User != "0:0" {
		t.Errorf("user %q, want 0:0 (the node agent writes root-owned host paths)", c.User)
	}
	if cfg.Architecture != "amd64" || cfg.OS != "linux" || !cfg.Created.Time.Equal(created) {
		t.Errorf("platform %s/%s created %v", cfg.OS, cfg.Architecture, cfg.Created)
	}
	if c.Labels["org.opencontainers.image.version"] != "test" {
		t.Errorf("labels %v", c.Labels)
	}
	for _, b := range Binaries {
		f, ok := files["/usr/local/bin/"+b]
		if !ok || f.Mode != 0o755 || f.Uid != 0 || f.Size != int64(len("#!binary "+b+"\n")) {
			t.Errorf("/usr/local/bin/%s: %+v (present %v)", b, f, ok)
		}
	}
	if f := files["/tmp"]; !f.Dir || f.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp: %+v, want a sticky world-writable directory", f)
	}
	if f := files["/home/nonroot"]; !f.Dir || f.Uid != NonRootUser {
		t.Errorf("/home/nonroot: %+v, want a directory of %d", f, NonRootUser)
	}
	passwd, _ := os.ReadFile("../../image/passwd")
	if !strings.Contains(string(passwd), "nonroot:x:65532:65532:") {
		t.Errorf("hack/image/passwd has no nonroot user 65532, which the chart runs the operator as")
	}
	if f := files["/etc/passwd"]; f.Size != int64(len(passwd)) || f.Mode != 0o644 {
		t.Errorf("/etc/passwd: %+v", f)
	}

	// Equal inputs give the same image.
	again, err := Build(Options{BinDir: fakeBinaries(t), RootFS: "../../image", Arch: "amd64", Version: "test", Created: created})
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same inputs: digests %s and %s", d1, d2)
	}
}

func TestVerifyRejects(t *testing.T) {
	bins := fakeBinaries(t)
	if err := os.Remove(filepath.Join(bins, "node-agent")); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Options{BinDir: bins, RootFS: "../../image", Arch: "amd64"}); err == nil ||
		!strings.Contains(err.Error(), "node-agent") {
		t.Errorf("Build without node-agent: %v, want an error naming it", err)
	}

	img, err := Build(Options{BinDir: fakeBinaries(t), RootFS: "../../image", Arch: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := Write(img, "local.test/rdmavisor:a", out); err != nil {
		t.Fatal(err)
	}
	if err := Verify(out, "local.test/rdmavisor:b"); err == nil {
		t.Error("Verify of a tag the tarball does not hold succeeded")
	}
}

// TestImageTarball checks a tarball hack/images.sh wrote, when
// RDMAVISOR_IMAGE_TARBALL names one (and RDMAVISOR_IMAGE_TAG its tag, by
// default local.test/rdmavisor:dev): hack/e2e.sh runs it on the image it
// builds, before the cluster imports it.
func TestImageTarball(t *testing.T) {
	path := os.Getenv("RDMAVISOR_IMAGE_TARBALL")
	if path == "" {
		t.Skip("RDMAVISOR_IMAGE_TARBALL is not set: hack/e2e.sh sets it to the tarball hack/images.sh built")
	}
	tag := os.Getenv("RDMAVISOR_IMAGE_TAG")
	if tag == "" {
		tag = "local.test/rdmavisor:dev"
	}
	if err := Verify(path, tag); err != nil {
		t.Fatal(err)
	}
	_, files, err := Read(path, tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range Binaries {
		if f := files["/usr/local/bin/"+b]; f.Size < 1<<20 {
			t.Errorf("/usr/local/bin/%s is %d bytes: not a real binary", b, f.Size)
		}
	}
}

func TestBuildSingle(t *testing.T) {
	const tag = "local.test/echo:test"
	bin := filepath.Join(t.TempDir(), "echo")
	if err := os.WriteFile(bin, []byte("#!binary echo\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := BuildSingle(bin, Options{Arch: "amd64", Version: "test", Created: time.Unix(0, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "echo.tar")
	if err := Write(img, tag, out); err != nil {
		t.Fatal(err)
	}
	cfg, files, err := Read(out, tag)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/echo"}) || cfg.Config.User != "65532:65532" {
		t.Fatalf("config: entrypoint %q user %q", cfg.Config.Entrypoint, cfg.Config.User)
	}
	if f, ok := files["/echo"]; !ok || f.Mode&0o111 == 0 || f.Size != 14 {
		t.Fatalf("/echo: %+v %v", f, ok)
	}
	if f := files["/tmp"]; !f.Dir || f.Mode&0o1777 != 0o1777 {
		t.Fatalf("/tmp: %+v", f)
	}
	if _, err := BuildSingle(filepath.Join(t.TempDir(), "missing"), Options{}); err == nil {
		t.Fatal("an image of a missing binary")
	}
}

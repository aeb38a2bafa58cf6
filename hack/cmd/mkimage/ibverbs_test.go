package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// cc compiles a C program into dir/node-agent with gcc.
func cc(t *testing.T, dir, src string, args ...string) string {
	t.Helper()
	out := filepath.Join(dir, "node-agent")
	cmd := exec.Command("gcc", append([]string{"-x", "c", "-o", out, "-"}, args...)...)
	cmd.Stdin = strings.NewReader(src)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v: %s", args, err, b)
	}
	return out
}

// The image of an ibverbs node agent carries what the agent loads:
// interpreter, libibverbs and its libraries, the driver files and every
// provider with its libraries; Verify finds them all, and finds what is
// missing in an image that lacks them. The stand-in agent is a C program
// linked with libibverbs, as the cgo build of the real one is.
func TestIBVerbsImage(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc (hack/deps.sh rxe installs it)")
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("no libibverbs-dev (hack/deps.sh rxe installs it)")
	}
	bins := fakeBinaries(t)
	agent := cc(t, bins, "#include <infiniband/verbs.h>\nint main(void) { int n; return ibv_get_device_list(&n) == 0; }\n", "-libverbs")
	files, err := IBVerbsFiles(agent, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{BinDir: bins, RootFS: "../../image", Arch: runtime.GOARCH, Version: "test", Created: time.Unix(0, 0).UTC(), HostFiles: files}
	img, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := Write(img, "local.test/rdmavisor:ibv", out); err != nil {
		t.Fatal(err)
	}
	if err := Verify(out, "local.test/rdmavisor:ibv"); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	_, fs, err := Read(out, "local.test/rdmavisor:ibv")
	if err != nil {
		t.Fatal(err)
	}
	tri := triplets[runtime.GOARCH]
	for _, p := range []string{"/etc/libibverbs.d/rxe.driver", "/etc/libibverbs.d/mlx5.driver",
		"/usr/lib/" + tri + "/libibverbs/librxe-rdmav34.so", "/usr/lib/" + tri + "/libibverbs/libmlx5-rdmav34.so",
		"/lib/" + tri + "/libibverbs.so.1", "/lib/" + tri + "/libc.so.6", "/lib64/ld-linux-x86-64.so.2"} {
		if runtime.GOARCH != "amd64" && strings.Contains(p, "ld-linux-x86-64") {
			continue
		}
		if r := resolve(fs, p); r == "" || fs[r].Dir || len(fs[r].Data) == 0 {
			t.Errorf("%s is not in the image (resolves to %q)", p, r)
		}
	}
	if d := string(fs["/etc/libibverbs.d/rxe.driver"].Data); !strings.Contains(d, "driver rxe") {
		t.Errorf("rxe.driver: %q", d)
	}
	// The other binaries stay as they were (static in the real image).
	if f := fs["/usr/local/bin/operator"]; string(f.Data) != "#!binary operator\n" {
		t.Errorf("operator: %q", f.Data)
	}

	// Without the host files, Verify names what the agent would miss.
	o.HostFiles = nil
	bare, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(bare, "local.test/rdmavisor:bare", out); err != nil {
		t.Fatal(err)
	}
	err = Verify(out, "local.test/rdmavisor:bare")
	for _, want := range []string{"interpreter", "needs libibverbs.so.1", "rxe.driver is missing"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Verify of an image without libibverbs: %v; want %q", err, want)
		}
	}
	// A static agent has no ibverbs backend.
	cc(t, bins, "int main(void) { return 0; }\n", "-static")
	if _, err := IBVerbsFiles(agent, runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "not dynamically linked") {
		t.Errorf("IBVerbsFiles of a static agent: %v", err)
	}
	o.HostFiles = files
	static, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := Write(static, "local.test/rdmavisor:static", out); err != nil {
		t.Fatal(err)
	}
	if err := Verify(out, "local.test/rdmavisor:static"); err == nil || !strings.Contains(err.Error(), "does not load libibverbs") {
		t.Errorf("Verify of an image with a static agent: %v", err)
	}
}

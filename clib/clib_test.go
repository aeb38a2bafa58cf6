package clib_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

// sanitizers the library and its C tests are built with: every report
// fails the run. -clib.sanitize=thread runs them under ThreadSanitizer
// instead (it cannot be combined with AddressSanitizer); none builds them
// plain, optimised, for the figures test_vconn prints.
var sanitizers = flag.String("clib.sanitize", "address,undefined", "the C tests' -fsanitize= list, or none")

func sanitize() string {
	if *sanitizers == "none" {
		return "-O2"
	}
	return "-fsanitize=" + *sanitizers + " -fno-sanitize-recover=all -fno-omit-frame-pointer"
}

// linkFlags are a C test's own link flags: test_shmcopy and test_recvfn
// count libvconn's allocations through the linker's --wrap.
var linkFlags = map[string][]string{
	"test_shmcopy": {"-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc"},
	"test_recvfn":  {"-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc"},
}

var built struct {
	once sync.Once
	dir  string // lib/ (the sanitized library), bin/ (the C tests)
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func run(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// build makes the sanitized library with its Makefile and links each C
// test (test/test_*.c) against it, and the parsers' harness from the
// sources; once per test binary.
func build(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "libvconn")
		if err != nil {
			built.err = err
			return
		}
		built.dir = dir
		lib := filepath.Join(dir, "lib")
		if built.err = run(".", "make", "BUILD="+lib, "CC=cc", "CFLAGS=-O1 -g -Werror "+sanitize()); built.err != nil {
			return
		}
		tests, _ := filepath.Glob("test/test_*.c")
		cflags := append([]string{"-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g"}, strings.Fields(sanitize())...)
		for _, src := range tests {
			name := strings.TrimSuffix(filepath.Base(src), ".c")
			out := filepath.Join(dir, "bin", name)
			_ = os.MkdirAll(filepath.Dir(out), 0o755)
			args := append(append([]string(nil), cflags...), src, filepath.Join(lib, "libvconn.a"), "-pthread", "-o", out)
			args = append(args, linkFlags[name]...)
			if built.err = run(".", "cc", args...); built.err != nil {
				return
			}
		}
		srcs, _ := filepath.Glob("src/*.c")
		args := append(append(append([]string(nil), cflags...), "test/fuzz_harness.c"), srcs...)
		built.err = run(".", "cc", append(args, "-pthread", "-o", filepath.Join(dir, "bin", "fuzz_harness"))...)
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir
}

// sanitizerEnv makes every sanitizer report fatal, leaks included.
func sanitizerEnv() []string {
	return append(os.Environ(),
		"ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1",
		"TSAN_OPTIONS=halt_on_error=1",
		"UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
}

// stacks makes a C test that runs past its time print every thread's
// stack (gdb, where installed) before it is killed: a hang's diagnosis.
func stacks(t *testing.T, cmd *exec.Cmd) {
	cmd.Cancel = func() error {
		if gdb, err := exec.LookPath("gdb"); err == nil {
			out, _ := exec.Command(gdb, "-p", fmt.Sprint(cmd.Process.Pid), "-batch", "-ex", "thread apply all bt").CombinedOutput()
			t.Logf("%s ran past its time; its threads:\n%s", cmd.Path, out)
		}
		return cmd.Process.Kill()
	}
}

// runC runs a C test with env added and fails the test unless it exits 0.
func runC(t *testing.T, name string, env ...string) string {
	t.Helper()
	dir := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "bin", name))
	cmd.Env = append(sanitizerEnv(), env...)
	stacks(t, cmd)
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", name, out)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return string(out)
}

func cluster(t *testing.T) *agenttest.Cluster {
	t.Helper()
	o := agenttest.Options{}
	if testing.Verbose() {
		o.Log = testr.NewWithInterface(t, testr.Options{Verbosity: 0})
	}
	c, err := agenttest.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	return c
}

// allocate makes allocation id of k vconns on n: its socket.
func allocate(t *testing.T, n *agenttest.Node, id string, k int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock, err := n.Allocate(ctx, id, k)
	if err != nil {
		t.Fatal(err)
	}
	return sock
}

// TestInstall installs the library with make install PREFIX=..., then
// builds a program against it through pkg-config, shared and static.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	prefix := filepath.Join(dir, "prefix")
	if err := run(".", "make", "install", "BUILD="+filepath.Join(dir, "build"), "PREFIX="+prefix); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"include/vconn.h", "lib/libvconn.a", "lib/libvconn.so", "lib/libvconn.so.0", "lib/pkgconfig/vconn.pc"} {
		if _, err := os.Stat(filepath.Join(prefix, f)); err != nil {
			t.Fatal(err)
		}
	}
	pc := exec.Command("pkg-config", "--cflags", "--libs", "vconn")
	pc.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(prefix, "lib", "pkgconfig"))
	flags, err := pc.Output()
	if err != nil {
		t.Fatalf("pkg-config: %v", err)
	}
	for _, link := range []string{"shared", "static"} {
		out := filepath.Join(dir, "example-"+link)
		args := append([]string{"-std=c11", "-Wall", "-Werror", "test/example.c", "-o", out}, strings.Fields(string(flags))...)
		if link == "static" {
			args = append(args, "-Wl,-Bstatic", "-lvconn", "-Wl,-Bdynamic", "-pthread")
		}
		if err := run(".", "cc", args...); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(out)
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(prefix, "lib"))
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", link, err, b)
		}
	}
}

// TestBuildsOptimized builds the library at -O3 with warnings as errors:
// inlining shows the compiler paths the tests' -O1 build does not (a NULL
// that reached memcpy in region.c failed this).
func TestBuildsOptimized(t *testing.T) {
	if err := run(".", "make", "BUILD="+filepath.Join(t.TempDir(), "build"), "CC=cc", "CFLAGS=-O3 -Werror"); err != nil {
		t.Fatal(err)
	}
}

package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

// systemPlugins is where Debian's containernetworking-plugins installs the
// reference plugins.
const systemPlugins = "/usr/lib/cni"

// buildPlugin builds cmd/rdmavisor-cni into a fresh directory and returns
// the binary's path.
func buildPlugin(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(t.TempDir(), PluginType)
	cmd := exec.Command(goBin, "build", "-o", out, "github.com/rdmavisor/rdmavisor/cmd/rdmavisor-cni")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building rdmavisor-cni: %v\n%s", err, b)
	}
	return out
}

// requireRoot fails a test that needs root (network namespaces, links).
// CI runs as root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (network namespaces and links); CI runs it as root")
	}
}

// requirePlugins fails unless the reference plugins are installed.
func requirePlugins(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(systemPlugins, n)); err != nil {
			t.Fatalf("the reference CNI plugin %s is missing from %s (%v): install Debian's containernetworking-plugins, as .ci/run does", n, systemPlugins, err)
		}
	}
}

// newNetns creates a network namespace bind-mounted on a file of a
// temporary directory; the test's cleanup unmounts it, which destroys it
// and the links inside.
func newNetns(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error)
	go func() {
		// The thread enters the new namespace and is never unlocked: it
		// exits with the goroutine, so no other goroutine runs in it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mounting %s: %w", src, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("creating a network namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the netns: %v", err)
		}
	})
	return path
}

// startAgent starts real agents and returns node-a.
func startAgent(t *testing.T) *agenttest.Node {
	t.Helper()
	c, err := agenttest.Start(agenttest.Options{VConnsPerNode: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c.Nodes[0]
}

// pods returns the pods the node's agent knows, or none if it is stopped.
func pods(n *agenttest.Node) []admin.Pod {
	if n.Agent == nil {
		return nil
	}
	return n.Agent.Pods()
}

// execResult is one run of the plugin binary.
type execResult struct {
	stdout, stderr string
	err            error // non-nil: non-zero exit
}

// cniError decodes a CNI error result from stdout.
func (r execResult) cniError(t *testing.T) *types.Error {
	t.Helper()
	if r.err == nil {
		t.Fatalf("the plugin succeeded (stdout %s), want an error", r.stdout)
	}
	var e types.Error
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || e.Code == 0 {
		t.Fatalf("stdout is not a CNI error result (%v): %q; stderr %s", err, r.stdout, r.stderr)
	}
	return &e
}

// execPlugin runs the plugin binary with a CNI command.
func execPlugin(bin, command, stdin string, env ...string) execResult {
	cmd := exec.Command(bin)
	cmd.Env = append([]string{"CNI_COMMAND=" + command, "CNI_PATH=" + filepath.Dir(bin), "PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return execResult{stdout: out.String(), stderr: errb.String(), err: err}
}

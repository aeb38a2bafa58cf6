// Package preload_test runs programs nobody here wrote (iperf3, redis, curl
// and Python's http.server, from Debian) between two agents of the test
// harness over vconns, through the preload library, and each one over TCP
// in the same run for comparison.
//
// RDMAVISOR_PRELOAD_REPORT=FILE has TestUnmodifiedPrograms write its table
// of figures to FILE; RDMAVISOR_PRELOAD_ROUNDS=N (default 1) measures each
// figure N times, the vconn and the TCP run in turns (which goes first
// alternating), and reports the medians of each path's runs and the median
// of the rounds' vconns/TCP ratios. hack/bench-e6-programs.sh runs it, with
// and without two CPU-bound processes beside.
package preload_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

// build makes libvconn, the preload library and the C test programs in a
// directory of the test's.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	_, file, _, _ := runtime.Caller(0)
	clib := filepath.Join(filepath.Dir(file), "..", "..", "clib")
	out, err := exec.Command("make", "-s", "-C", clib, "BUILD="+dir, "all", "preload").CombinedOutput()
	if err != nil {
		t.Fatalf("make -C clib preload: %v\n%s", err, out)
	}
	return dir
}

// need fails the test when a program it runs is missing: hack/deps.sh
// test installs them.
func need(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s is not installed: run hack/deps.sh test (as root) or apt-get install it", p)
		}
	}
}

// syncBuffer is a bytes.Buffer several processes' output goes into.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

type harness struct {
	t       *testing.T
	lib     string
	cluster *agenttest.Cluster
	server  string // node-a's allocation socket of the running subtest's servers
	srvID   string // its allocation
	client  string // node-b's
	ip      string // node-a's IP: clients connect to it
	report  *strings.Builder
	rounds  int // of each measurement (RDMAVISOR_PRELOAD_ROUNDS)
}

func newHarness(t *testing.T) *harness {
	dir := build(t)
	c, err := agenttest.Start(agenttest.Options{VConnsPerNode: 256, Transport: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := &harness{t: t, lib: filepath.Join(dir, "librdmavisor-preload.so"), cluster: c, ip: c.Nodes[0].IP, report: &strings.Builder{}, rounds: 1}
	if s := os.Getenv("RDMAVISOR_PRELOAD_ROUNDS"); s != "" {
		if h.rounds, err = strconv.Atoi(s); err != nil || h.rounds < 1 {
			t.Fatalf("RDMAVISOR_PRELOAD_ROUNDS=%q: want a count of rounds", s)
		}
	}
	if h.client, err = c.Nodes[1].Allocate(ctx, "clients", 64); err != nil {
		t.Fatal(err)
	}
	return h
}

// env is the environment of a program on vconns: the preload library,
// its allocation's socket, and what it connects to or listens on.
func (h *harness) env(sock, connect, listen string) []string {
	e := append(os.Environ(), "LD_PRELOAD="+h.lib, "RDMAVISOR_SOCKET="+sock)
	if connect != "" {
		e = append(e, "RDMAVISOR_PRELOAD_CONNECT="+connect)
	}
	if listen != "" {
		e = append(e, "RDMAVISOR_PRELOAD_LISTEN="+listen)
	}
	return e
}

// start starts a server in the background; it is killed at the end.
func (h *harness) start(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = env
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group: the servers fork, and their children hold
	// the output pipe too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if h.t.Failed() {
			h.t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return cmd
}

func (h *harness) run(env []string, stdin []byte, name string, args ...string) []byte {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		h.t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// waitTCP waits until something accepts on addr (the TCP runs' servers).
func waitTCP(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// servers gives subtest t an allocation of its own on node-a for its
// servers, so that what it listens on is its own to count (waitListen).
func (h *harness) servers(t *testing.T, id string) {
	h.t, h.srvID = t, id
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	if h.server, err = h.cluster.Nodes[0].Allocate(ctx, id, 64); err != nil {
		t.Fatal(err)
	}
}

// waitListen waits until the subtest's servers listen on n ports.
func (h *harness) waitListen(n int) {
	h.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		for _, al := range h.cluster.Nodes[0].Agent.Allocations() {
			if al.ID == h.srvID && al.Listeners >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("allocation %s does not listen on %d ports: %+v", h.srvID, n, h.cluster.Nodes[0].Agent.Allocations())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

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
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/bench"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
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

// paired measures figures over vconns (vconn gives one value of each) and
// over TCP (tcp) h.rounds times, in turns, the first of a round
// alternating, so that a change in the machine's speed (other work on its
// cores) hits both alike; it reports the medians of each path's values and
// the median of the rounds' ratios.
func (h *harness) paired(program string, figures []string, unit string, vconn, tcp func() []float64) {
	var v, p [][]float64
	for r := range h.rounds {
		if r%2 == 0 {
			v = append(v, vconn())
			p = append(p, tcp())
		} else {
			p = append(p, tcp())
			v = append(v, vconn())
		}
	}
	for i, f := range figures {
		var vs, ps, ratios []float64
		for r := range v {
			vs, ps = append(vs, v[r][i]), append(ps, p[r][i])
			ratios = append(ratios, v[r][i]/p[r][i])
		}
		fmt.Fprintf(h.report, "| %s | %s | %s %s | %s %s | %.2f |\n", program, f, num(bench.Median(vs)), unit, num(bench.Median(ps)), unit, bench.Median(ratios))
	}
}

// num writes x with three significant digits, or whole above 1000.
func num(x float64) string {
	if x >= 1000 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// TestUnmodifiedPrograms runs iperf3, redis and curl against
// http.server, each over vconns and over TCP, and checks every byte.
func TestUnmodifiedPrograms(t *testing.T) {
	need(t, "make", "cc", "iperf3", "redis-server", "redis-cli", "redis-benchmark", "curl", "python3")
	h := newHarness(t)
	fmt.Fprintln(h.report, "| program | figure | over vconns | over TCP | vconns/TCP |")
	fmt.Fprintln(h.report, "|---|---|---:|---:|---:|")
	t.Run("iperf3", h.iperf3)
	t.Run("redis", h.redis)
	t.Run("http", h.http)
	t.Logf("unmodified programs between two agents (soft provider, UDP on loopback), each over TCP in the same run:\n%s", h.report)
	if p := os.Getenv("RDMAVISOR_PRELOAD_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(h.report.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func (h *harness) iperf3(t *testing.T) {
	h.servers(t, "iperf3")
	const vport, tport = 5201, 5202
	h.start(h.env(h.server, "", strconv.Itoa(vport)), "iperf3", "-s", "-p", strconv.Itoa(vport))
	h.waitListen(1)
	h.start(os.Environ(), "iperf3", "-s", "-B", h.ip, "-p", strconv.Itoa(tport))
	waitTCP(t, fmt.Sprintf("%s:%d", h.ip, tport))
	for _, reverse := range []bool{false, true} {
		dir := "client to server"
		args := []string{"-c", h.ip, "-t", "3", "-J"}
		if reverse {
			dir, args = "server to client", append(args, "-R")
		}
		h.paired("iperf3", []string{"throughput, " + dir}, "Mbit/s", func() []float64 {
			return []float64{h.iperfClient(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, vport), ""), append(args, "-p", strconv.Itoa(vport))) / 1e6}
		}, func() []float64 {
			return []float64{h.iperfClient(os.Environ(), append(args, "-p", strconv.Itoa(tport))) / 1e6}
		})
	}
}

// iperfClient runs an iperf3 client and gives the rate the receiver
// measured. The iperf3 server closes its listening socket at the end of a
// test and opens a new one for the next (its "Server listening on PORT
// (test #N)"), so a client that comes right after another (a round's last
// run, then the next round's first on the same path) may find nothing
// listening, more so through the preload library, whose listen asks the
// agent, on a busy machine: it tries again for a few seconds.
func (h *harness) iperfClient(env, args []string) float64 {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "iperf3", args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		var r iperfReport
		perr := json.Unmarshal(out, &r)
		if perr == nil && strings.Contains(r.Error, "unable to connect") && time.Now().Before(deadline) {
			h.t.Logf("iperf3 %s: %s: again", strings.Join(args, " "), r.Error)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if perr != nil {
			h.t.Fatalf("iperf3 %s: %v, -J: %v\n%s%s", strings.Join(args, " "), err, perr, out, stderr.Bytes())
		}
		if err != nil || r.Error != "" || r.End.SumReceived.Bytes == 0 {
			h.t.Fatalf("iperf3 %s: %v: error %q, %d bytes received\n%s", strings.Join(args, " "), err, r.Error, r.End.SumReceived.Bytes, stderr.Bytes())
		}
		return r.End.SumReceived.BitsPerSecond
	}
}

// iperfReport is what iperf3 -J reports: the receiver's count.
type iperfReport struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Bytes         int64   `json:"bytes"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

func (h *harness) redis(t *testing.T) {
	h.servers(t, "redis")
	const vport, tport = 6379, 6380
	common := []string{"--save", "", "--appendonly", "no", "--protected-mode", "no"}
	h.start(h.env(h.server, "", strconv.Itoa(vport)), "redis-server", append([]string{"--port", strconv.Itoa(vport), "--bind", h.ip}, common...)...)
	h.waitListen(1)
	h.start(os.Environ(), "redis-server", append([]string{"--port", strconv.Itoa(tport), "--bind", h.ip}, common...)...)
	waitTCP(t, fmt.Sprintf("%s:%d", h.ip, tport))
	venv := h.env(h.client, fmt.Sprintf("%s:%d", h.ip, vport), "")
	// Every reply checked: 2,000 keys of random values written, then
	// read back through redis-cli, reply by reply.
	for _, c := range []struct {
		env  []string
		port int
	}{{venv, vport}, {os.Environ(), tport}} {
		var set, get bytes.Buffer
		want := make([]string, 2000)
		for i := range want {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			want[i] = fmt.Sprintf("%x", b)
			fmt.Fprintf(&set, "SET key:%d %s\n", i, want[i])
			fmt.Fprintf(&get, "GET key:%d\n", i)
		}
		args := []string{"-h", h.ip, "-p", strconv.Itoa(c.port)}
		okays := strings.Fields(string(h.run(c.env, set.Bytes(), "redis-cli", args...)))
		if len(okays) != len(want) || strings.Count(strings.Join(okays, " "), "OK") != len(want) {
			t.Fatalf("port %d: SET replies: %d, want %d OK", c.port, len(okays), len(want))
		}
		got := strings.Fields(string(h.run(c.env, get.Bytes(), "redis-cli", args...)))
		if len(got) != len(want) {
			t.Fatalf("port %d: GET replies: %d, want %d", c.port, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("port %d: GET key:%d = %q, want %q", c.port, i, got[i], want[i])
			}
		}
	}
	// redis-benchmark at 1, 8 and 32 clients (connections at once, each
	// with one request outstanding); a quarter of the requests when no
	// report is asked for (a check, in CI under -race).
	div := 4
	if os.Getenv("RDMAVISOR_PRELOAD_REPORT") != "" {
		div = 1
	}
	for _, c := range []struct{ clients, requests int }{{1, 10000}, {8, 20000}, {32, 20000}} {
		bench := func(env []string, port int) []float64 {
			out := h.run(env, nil, "redis-benchmark", "-h", h.ip, "-p", strconv.Itoa(port), "-n", strconv.Itoa(c.requests/div),
				"-c", strconv.Itoa(c.clients), "-t", "set,get", "--csv")
			return []float64{csvRate(t, out, "SET"), csvRate(t, out, "GET")}
		}
		clients := fmt.Sprintf("%d client", c.clients)
		if c.clients > 1 {
			clients += "s"
		}
		h.paired("redis-benchmark", []string{"SET requests/s, " + clients, "GET requests/s, " + clients}, "req/s",
			func() []float64 { return bench(venv, vport) }, func() []float64 { return bench(os.Environ(), tport) })
	}
}

var csvLine = regexp.MustCompile(`^"([A-Z]+)","([\d.]+)"`)

func csvRate(t *testing.T, out []byte, test string) float64 {
	t.Helper()
	for _, l := range strings.Split(string(out), "\n") {
		if m := csvLine.FindStringSubmatch(l); m != nil && m[1] == test {
			v, err := strconv.ParseFloat(m[2], 64)
			if err == nil && v > 0 {
				return v
			}
		}
	}
	t.Fatalf("redis-benchmark --csv: no %s rate in\n%s", test, out)
	return 0
}

func (h *harness) http(t *testing.T) {
	h.servers(t, "http")
	const vport, tport = 8000, 8001
	root := t.TempDir()
	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(root, "blob"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	for _, c := range []struct {
		env  []string
		port int
	}{{h.env(h.server, "", strconv.Itoa(vport)), vport}, {os.Environ(), tport}} {
		srv := h.start(c.env, "python3", "-m", "http.server", strconv.Itoa(c.port), "--bind", h.ip, "--directory", root)
		_ = srv
	}
	h.waitListen(1)
	waitTCP(t, fmt.Sprintf("%s:%d", h.ip, tport))
	get := func(env []string, port int) float64 {
		out := filepath.Join(t.TempDir(), "blob")
		speed := h.run(env, nil, "curl", "-sS", "--fail", "-o", out, "-w", "%{speed_download}", fmt.Sprintf("http://%s:%d/blob", h.ip, port))
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sum {
			t.Fatalf("port %d: the file fetched (%d bytes) differs from the one served (%d)", port, len(got), len(data))
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(speed)), 64)
		if err != nil {
			t.Fatalf("curl speed %q: %v", speed, err)
		}
		return v
	}
	h.paired("curl ← python3 -m http.server", []string{"64 MiB file, checksum equal"}, "MB/s", func() []float64 {
		return []float64{get(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, vport), ""), vport) / 1e6}
	}, func() []float64 {
		return []float64{get(os.Environ(), tport) / 1e6}
	})
}

// TestPreloadBadVariable: a malformed variable stops the program at start
// and says which variable and which entry.
func TestPreloadBadVariable(t *testing.T) {
	need(t, "make", "cc")
	lib := filepath.Join(build(t), "librdmavisor-preload.so")
	for _, c := range []struct{ name, value, says string }{
		{"RDMAVISOR_PRELOAD_CONNECT", "10.0.0.1", `bad entry "10.0.0.1"`},
		{"RDMAVISOR_PRELOAD_CONNECT", "10.0.0.1:99999", `bad entry "10.0.0.1:99999"`},
		{"RDMAVISOR_PRELOAD_CONNECT", "*:*", `bad entry "*:*"`},
		{"RDMAVISOR_PRELOAD_CONNECT", "10.0.0.1:80,,", `bad entry ""`},
		{"RDMAVISOR_PRELOAD_LISTEN", "http", `bad entry "http"`},
		{"RDMAVISOR_PRELOAD_LISTEN", "0", `bad entry "0"`},
	} {
		cmd := exec.Command("true")
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "RDMAVISOR_SOCKET=/nonexistent", c.name+"="+c.value)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !bytes.Contains(out, []byte(c.name)) || !bytes.Contains(out, []byte(c.says)) {
			t.Errorf("%s=%q: exit %v, output %q; want exit 2 naming the variable and %s", c.name, c.value, err, out, c.says)
		}
	}
	cmd := exec.Command("true")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "RDMAVISOR_SOCKET=", "RDMAVISOR_PRELOAD_LISTEN=80")
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !bytes.Contains(out, []byte("RDMAVISOR_SOCKET")) {
		t.Errorf("no socket: %q, want exit 2 naming RDMAVISOR_SOCKET", out)
	}
}

// TestPreloadFork: a pre-forking server (two children accept on one
// listening socket) and a client that forks: the child talks on the
// inherited socket and exits, the parent goes on on the same one.
func TestPreloadFork(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	h.servers(t, "forkecho")
	dir := filepath.Dir(h.lib)
	const port = "7100"
	h.start(h.env(h.server, "", port), filepath.Join(dir, "forkecho"), "server", h.ip, port)
	h.waitListen(1)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(filepath.Join(dir, "forkecho"), "client", h.ip, port)
			cmd.Env = h.env(h.client, h.ip+":"+port, "")
			out, err := cmd.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("child ok")) || !bytes.Contains(out, []byte("parent ok")) {
				errs <- fmt.Errorf("client %d: %v: %s", i, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// vconnServer listens on port of node-a for the subtest with a client of
// its own, and hands each vconn it accepts to serve; accepted says when
// serve returned, with what it returned.
func (h *harness) vconnServer(t *testing.T, id string, port int, serve func(*vconn.Conn) error) (accepted <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := h.cluster.Nodes[0].Client(ctx, id, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ln, err := c.Listen(ctx, fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	done := make(chan error, 1)
	go func() {
		conn, err := ln.AcceptVConn()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		done <- serve(conn)
	}()
	return done
}

// TestPreloadDup: a TCP program's socket, a vconn under the preload
// library, copied with dup, dup2 and dup3: every copy echoes through the
// one vconn and names its peer, a line written on one copy is read on
// another, the copies are closed one by one with the others still
// echoing, and the vconn ends (the peer reads its end) once the last
// copy is closed, not before.
func TestPreloadDup(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	const port = 7200
	var echoed atomic.Int64
	done := h.vconnServer(t, "dup-server", port, func(c *vconn.Conn) error {
		n, err := io.Copy(c, c) // to the end of the program's last copy
		echoed.Store(n)
		return err
	})
	out := h.run(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, port), ""), nil, filepath.Join(filepath.Dir(h.lib), "dupsend"), "dup", h.ip, strconv.Itoa(port))
	if string(out) != "dup ok\n" {
		t.Fatalf("dupsend dup printed %q", out)
	}
	select {
	case err := <-done:
		// 4 lines, "across", and the lines after each of the 3 closes.
		want := int64(0)
		for i := range 4 {
			want += int64(len(fmt.Sprintf("on copy %d\n", i)))
		}
		want += int64(len("across\n"))
		for i := range 3 {
			for j := i + 1; j < 4; j++ {
				want += int64(len(fmt.Sprintf("copy %d after closing %d\n", j, i)))
			}
		}
		if err != nil || echoed.Load() != want {
			t.Fatalf("the vconn echoed %d bytes, then %v; want %d bytes, then its end", echoed.Load(), err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the program closed every copy and exited, and its vconn has not ended")
	}
}

// TestPreloadSendfile: a TCP program sends a file of 3 MiB and a few bytes
// with sendfile, half through the file's offset and half from offsets of
// its own, into its socket, a vconn under the preload library; the peer
// reads every byte, in order, then the end.
func TestPreloadSendfile(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	const port = 7201
	file := make([]byte, 3<<20+12345)
	_, _ = rand.Read(file)
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	done := h.vconnServer(t, "sendfile-server", port, func(c *vconn.Conn) error {
		_, err := io.Copy(&got, c)
		return err
	})
	out := h.run(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, port), ""), nil, filepath.Join(filepath.Dir(h.lib), "dupsend"), "sendfile", h.ip, strconv.Itoa(port), path)
	if want := fmt.Sprintf("sendfile ok %d\n", len(file)); string(out) != want {
		t.Fatalf("dupsend sendfile printed %q, want %q", out, want)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("reading the vconn: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the peer read %d bytes and no end in 30s", got.Len())
	}
	if !bytes.Equal(got.Bytes(), file) {
		i := 0
		for i < min(got.Len(), len(file)) && got.Bytes()[i] == file[i] {
			i++
		}
		t.Fatalf("the peer read %d bytes of %d; the first %d as sent", got.Len(), len(file), i)
	}
}

package clib_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
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
			out := filepath.Join(dir, "bin", strings.TrimSuffix(filepath.Base(src), ".c"))
			_ = os.MkdirAll(filepath.Dir(out), 0o755)
			args := append(append([]string(nil), cflags...), src, filepath.Join(lib, "libvconn.a"), "-pthread", "-o", out)
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

// TestCAgainstAgents runs test/test_vconn.c against node-a and node-b, on
// the socket and on shared memory.
func TestCAgainstAgents(t *testing.T) {
	for _, mode := range []string{"socket", "shm"} {
		t.Run(mode, func(t *testing.T) {
			cl := cluster(t)
			a := allocate(t, cl.Nodes[0], "c-a", 4)
			b := allocate(t, cl.Nodes[1], "c-b", 16)
			shmOn := "0"
			if mode == "shm" {
				shmOn = "1"
			}
			out := runC(t, "test_vconn", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name,
				"VCONN_PORT=7000", "VCONN_SHM="+shmOn)
			if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
				t.Fatalf("test_vconn did not finish")
			}
			goRoundTrips(t, cl, a, b, mode == "shm")
		})
	}
}

// goRoundTrips measures what test_vconn.c prints, round trips of 32-byte
// messages, with the Go SDK on the same agents: the figure to set beside
// libvconn's (a measurement, not an assertion).
func goRoundTrips(t *testing.T, cl *agenttest.Cluster, sockA, sockB string, shared bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ga, err := vconn.NewClient(ctx, vconn.Options{Socket: sockA, SharedMemory: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Close()
	gb, err := vconn.NewClient(ctx, vconn.Options{Socket: sockB, SharedMemory: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	ln, err := gb.Listen(ctx, ":7100")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptVConn()
		if err != nil {
			return
		}
		defer c.Close()
		for {
			m, err := c.RecvMsg(ctx)
			if err != nil || c.SendMsg(ctx, m.Data) != nil {
				return
			}
		}
	}()
	c, err := ga.Dial(ctx, cl.Nodes[1].Name+":7100")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const rounds = 500
	msg := make([]byte, 32)
	start := time.Now()
	for i := 0; i < rounds; i++ {
		if err := c.SendMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RecvMsg(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("Go SDK round trip: %d of 32 bytes, %.1f us each", rounds, float64(time.Since(start).Microseconds())/rounds)
}

// TestCThreads runs test/test_threads.c: concurrent vconns, dials and
// closes on one client, then node-a's agent stops under a blocked read
// (when the program prints "stop").
func TestCThreads(t *testing.T) {
	for _, mode := range []string{"socket", "shm"} {
		t.Run(mode, func(t *testing.T) {
			cl := cluster(t)
			a := allocate(t, cl.Nodes[0], "t-a", 8)
			b := allocate(t, cl.Nodes[1], "t-b", 16)
			shmOn := "0"
			if mode == "shm" {
				shmOn = "1"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(build(t), "bin", "test_threads"))
			cmd.Env = append(sanitizerEnv(), "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name,
				"VCONN_PORT=7003", "VCONN_SHM="+shmOn)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stacks(t, cmd)
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				out.WriteString(sc.Text() + "\n")
				if sc.Text() == "stop" {
					if err := cl.Nodes[0].Stop(); err != nil {
						t.Errorf("stop node-a: %v", err)
					}
				}
			}
			err := cmd.Wait()
			t.Logf("test_threads:\n%s%s", out.String(), stderr.String())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(strings.TrimSpace(out.String()), "ok") {
				t.Fatal("test_threads did not finish")
			}
		})
	}
}

// TestCLeader runs test/test_lead.c: a thread waiting for a reply reads
// the socket itself (its background reader reads next to none of a ping
// pong's frames), and the background reader reads the answers to sends
// nobody waits for.
func TestCLeader(t *testing.T) {
	cl := cluster(t)
	a := allocate(t, cl.Nodes[0], "ld-a", 4)
	b := allocate(t, cl.Nodes[1], "ld-b", 4)
	out := runC(t, "test_lead", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT=7006")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatalf("test_lead did not finish")
	}
}

// TestCBridge runs test/test_bridge.c: vconns the agent hands over as
// kernel sockets (FlagBridge), read and written, half-closed, shared with
// a forked child, outliving their client.
func TestCBridge(t *testing.T) {
	cl := cluster(t)
	a := allocate(t, cl.Nodes[0], "br-a", 8)
	b := allocate(t, cl.Nodes[1], "br-b", 8)
	out := runC(t, "test_bridge", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT=7004")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatal("test_bridge did not finish")
	}
}

// TestCBadInput: a C client's malformed frames each get a clear error
// and close its connection only; the library's clients, and a Go client
// of the same allocation, work afterwards.
func TestCBadInput(t *testing.T) {
	cl := cluster(t)
	a := allocate(t, cl.Nodes[0], "bad-a", 4)
	b := allocate(t, cl.Nodes[1], "bad-b", 4)
	out := runC(t, "test_badinput", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT=7001")
	for _, want := range []string{"short datagram: error 1", "version 2: error 1", "unknown op: error 1", "unknown flag: error 1",
		"length mismatch: error 1", "grant on handle 0: error 1", "dial with req 0: error 1",
		"dial before hello: error 1", "a reply sent as a request: error 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output", want)
		}
	}
	// And a Go client of the same allocation.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, err := vconn.NewClient(ctx, vconn.Options{Socket: a})
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Close()
	gb, err := vconn.NewClient(ctx, vconn.Options{Socket: b})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	ln, err := gb.Listen(ctx, ":7002")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	c, err := ga.Dial(ctx, cl.Nodes[1].Name+":7002")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo after the bad clients: %q, %v", got, err)
	}
}

// TestCProtocol runs test/test_protocol.c: the rules issue 35 clarified,
// as libvconn meets them (bad arguments with their own codes, the client
// kept; bridging refused on ud before any listener hears of it).
func TestCProtocol(t *testing.T) {
	cl := cluster(t)
	ud, err := agenttest.Start(agenttest.Options{Transport: config.TransportUD})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ud.Close(); err != nil {
			t.Errorf("close the ud cluster: %v", err)
		}
	})
	out := runC(t, "test_protocol", "VCONN_SOCK_A="+allocate(t, cl.Nodes[0], "p-a", 4), "VCONN_SOCK_B="+allocate(t, cl.Nodes[1], "p-b", 4),
		"VCONN_UD_SOCK_A="+allocate(t, ud.Nodes[0], "u-a", 4), "VCONN_UD_SOCK_B="+allocate(t, ud.Nodes[1], "u-b", 4),
		"VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT=7005")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatal("test_protocol did not finish")
	}
}

// fakeAgent serves one connection per variant on a unixpacket socket,
// answering as serve says: a hostile or broken agent.
func fakeAgent(t *testing.T, serve func(c *net.UnixConn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return path
}

func encode(t testing.TB, f frame.Frame) []byte {
	b, err := frame.Append(nil, &f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCMalformedAgent: whatever the agent sends, libvconn returns a clear
// error (never crashes, never reads out of bounds: the sanitizers watch).
func TestCMalformedAgent(t *testing.T) {
	helloOK := func(req uint32) []byte {
		return encode(t, frame.Frame{Op: frame.OpOK, Req: req, Arg: frame.Version,
			Payload: frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "fake"})})
	}
	// reqOf reads the request's id; 0 if the client sent nothing.
	next := func(c *net.UnixConn) uint32 {
		b := make([]byte, frame.MaxFrame)
		n, err := c.Read(b)
		if err != nil {
			return 0
		}
		f, err := frame.Decode(b[:n])
		if err != nil {
			return 0
		}
		return f.Req
	}
	afterHello := func(reply func(req uint32) []byte) func(c *net.UnixConn) {
		return func(c *net.UnixConn) {
			_, _ = c.Write(helloOK(next(c)))
			if b := reply(next(c)); b != nil {
				_, _ = c.Write(b)
			}
			_, _ = io.Copy(io.Discard, c)
		}
	}
	onHello := func(reply func(req uint32) []byte) func(c *net.UnixConn) {
		return func(c *net.UnixConn) {
			if b := reply(next(c)); b != nil {
				_, _ = c.Write(b)
			}
		}
	}
	mutate := func(b []byte, f func([]byte)) []byte { f(b); return b }
	for _, tc := range []struct {
		name  string
		serve func(*net.UnixConn)
		want  string
	}{
		{"garbage", onHello(func(uint32) []byte { return []byte{1, 2, 3} }), "open=-71 "},
		{"version byte", onHello(func(r uint32) []byte { return mutate(helloOK(r), func(b []byte) { b[0] = 2 }) }), "open=-71 "},
		{"length", onHello(func(r uint32) []byte { return mutate(helloOK(r), func(b []byte) { b[27]++ }) }), "open=-71 "},
		{"flags", onHello(func(r uint32) []byte { return mutate(helloOK(r), func(b []byte) { b[2] = 0xff }) }), "open=-71 "},
		{"oversized", onHello(func(r uint32) []byte {
			b := append(helloOK(r), make([]byte, frame.MaxFrame)...)[:frame.MaxFrame+1]
			binary.BigEndian.PutUint32(b[24:], frame.MaxPayload+1)
			return b
		}), "open=-71 "},
		{"short hello info", onHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpOK, Req: r, Arg: frame.Version, Payload: []byte{0, 0, 0, 4, 0}})
		}), "open=-71 "},
		{"wrong version", onHello(func(r uint32) []byte {
			return mutate(helloOK(r), func(b []byte) { b[15] = 2 })
		}), "open=-93 "},
		{"version refused", onHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Req: r, Arg: uint32(frame.CodeVersion), Payload: []byte("speaks 2")})
		}), "open=-93 "},
		{"hang up", onHello(func(uint32) []byte { return nil }), "open=-107 "},
		{"dial answered with garbage", afterHello(func(uint32) []byte { return []byte("not a frame at all, nothing like one") }), "dial=-71 "},
		{"dial answered with a request", afterHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpListen, Req: r})
		}), "dial=-71 "},
		{"dial refused", afterHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Req: r, Arg: uint32(frame.CodeRefused), Payload: []byte("nobody")})
		}), "dial=-111 "},
		{"dial code unknown", afterHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Req: r, Arg: 4000})
		}), "dial=-121 "},
		// An Error with req 0 and handle 0 ends the session at once, with
		// the agent's reason, though the connection stays open.
		{"session ended", afterHello(func(uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Arg: uint32(frame.CodeBadRequest), Payload: []byte("you lost track")})
		}), "dial=-22 (bad request: the agent ended the session: you lost track)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runC(t, "test_fakeagent", "VCONN_SOCK="+fakeAgent(t, tc.serve))
			if !strings.Contains(out, tc.want) {
				t.Fatalf("want %q in the output", tc.want)
			}
		})
	}
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

// harness is the parsers' C harness, one process for many inputs.
type harness struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startHarness(t testing.TB) *harness {
	t.Helper()
	cmd := exec.Command(filepath.Join(build(t), "bin", "fuzz_harness"))
	cmd.Env = sanitizerEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &harness{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("harness: %v\n%s", err, stderr.String())
		}
	})
	return h
}

// parse feeds b to the harness: its line.
func (h *harness) parse(t testing.TB, b []byte) string {
	t.Helper()
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := h.in.Write(append(n[:], b...)); err != nil {
		t.Fatalf("harness died: %v", err)
	}
	l, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("harness died on %x: %v", b, err)
	}
	return strings.TrimSuffix(l, "\n")
}

// want is the harness's line as package frame and package shm read b,
// but for the ring part, which only the harness reads.
func want(b []byte) string {
	var s strings.Builder
	if f, err := frame.Decode(b); err == nil {
		fmt.Fprintf(&s, "frame ok op=%d flags=%d req=%d handle=%d arg=%d arg2=%d len=%d", f.Op, f.Flags, f.Req, f.Handle, f.Arg, f.Arg2, len(f.Payload))
	} else {
		s.WriteString("frame err ")
		for name, e := range map[string]error{"short": frame.ErrShort, "version": frame.ErrVersion, "op": frame.ErrOp,
			"flags": frame.ErrFlags, "too-big": frame.ErrTooBig, "length": frame.ErrLength} {
			if strings.HasPrefix(err.Error(), e.Error()) {
				s.WriteString(name)
			}
		}
	}
	if h, err := frame.DecodeHello(b); err == nil {
		fmt.Fprintf(&s, " | hello ok %d %d %d %s", h.Quota, h.SendWindow, h.MaxMessage, hex.EncodeToString([]byte(h.Node)))
	} else {
		s.WriteString(" | hello err")
	}
	if l, err := shm.DecodeLayout(b); err == nil {
		fmt.Fprintf(&s, " | layout ok %d %d %d %d", l.Entries, l.Slab, l.MaxMessage, l.Size())
	} else {
		s.WriteString(" | layout err")
	}
	return s.String()
}

func compare(t testing.TB, h *harness, b []byte) {
	got := h.parse(t, b)
	w := want(b)
	if g, _, _ := strings.Cut(got, " | ring"); g != w {
		t.Fatalf("input %x:\n   libvconn: %s\npackage Go: %s", b, g, w)
	}
}

// docExamples are the datagrams of docs/protocol.md's frame and
// frame-invalid blocks, with the check each invalid one names.
func docExamples(t testing.TB) (valid [][]byte, invalid map[string]string) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	invalid = map[string]string{}
	lines := strings.Split(string(doc), "\n")
	for i, l := range lines {
		if (l != "```frame" && l != "```frame-invalid") || i+2 >= len(lines) {
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(lines[i+1], " ", ""))
		if err != nil {
			t.Fatalf("protocol.md:%d: %v", i+2, err)
		}
		if l == "```frame" {
			valid = append(valid, b)
		} else {
			invalid[string(b)] = strings.TrimPrefix(lines[i+2], "error=")
		}
	}
	if len(valid) < 10 || len(invalid) < 5 {
		t.Fatalf("protocol.md: %d frames, %d invalid ones", len(valid), len(invalid))
	}
	return valid, invalid
}

// TestCDecodesDocExamples: libvconn reads the document's examples as
// package frame does (which TestProtocolDocExamples holds to the
// document), and refuses the invalid ones for the reason the document
// gives.
func TestCDecodesDocExamples(t *testing.T) {
	h := startHarness(t)
	valid, invalid := docExamples(t)
	for _, b := range valid {
		compare(t, h, b)
		if !strings.HasPrefix(h.parse(t, b), "frame ok") {
			t.Errorf("%x: refused", b)
		}
	}
	for b, why := range invalid {
		compare(t, h, []byte(b))
		if got := h.parse(t, []byte(b)); !strings.HasPrefix(got, "frame err "+why+" ") {
			t.Errorf("%x: %s, the document says %s", b, got, why)
		}
	}
	// Payload shapes: the Hello info and shm layout of the document.
	compare(t, h, frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "node-a"}))
	compare(t, h, shm.AppendLayout(nil, shm.DefaultLayout))
}

// FuzzCDecode feeds arbitrary bytes through libvconn's parsers (frames,
// Hello info, shm layouts, a ring RX an agent wrote) under the
// sanitizers, and checks that the frame, Hello and layout parsers agree
// with package frame's and shm's.
func FuzzCDecode(f *testing.F) {
	valid, invalid := docExamples(f)
	for _, b := range valid {
		f.Add(b)
	}
	for b := range invalid {
		f.Add([]byte(b))
	}
	f.Add(shm.AppendLayout(nil, shm.DefaultLayout))
	// A ring with one good descriptor and one out of bounds.
	ring := make([]byte, 256+4*16+256)
	ring[0] = 2 // tail
	copy(ring[256:], []byte{64, 0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0})
	copy(ring[272:], []byte{250, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(ring)
	h := startHarness(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > frame.MaxFrame+8 {
			return
		}
		compare(t, h, b)
	})
}

// TestCHostileSharedMemory: a fake agent that answers Shm with a segment
// the client must not trust (unsealed, too small, a bad layout, missing
// or wrong descriptors, a ring whose indices lie) gets a clear error from
// libvconn, never a crash or an access outside the mapping.
func TestCHostileSharedMemory(t *testing.T) {
	layout := shm.DefaultLayout
	memfd := func(t *testing.T, size int, seal bool) int {
		fd, err := unix.MemfdCreate("fake", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Error(err) // on the fake agent's goroutine: no Fatal
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Error(err) // on the fake agent's goroutine: no Fatal
		}
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
		}
		return fd
	}
	bells := func(t *testing.T) (mine, theirs [2]int) {
		for i := range 2 {
			p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
			mine[i], theirs[i] = p[0], p[1]
		}
		return mine, theirs
	}
	for _, tc := range []struct {
		name string
		// segment returns the Shm reply's payload and descriptors, and
		// what to do to the mapping once the client has it.
		segment func(t *testing.T) (payload []byte, fds []int, after func())
		want    string
	}{
		{"unsealed", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size(), false), b[0], b[1]}, nil
		}, "dial=-71 "},
		{"too small", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size()/2, true), b[0], b[1]}, nil
		}, "dial=-71 "},
		{"bad layout", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			l := layout
			l.Entries = 3
			return shm.AppendLayout(nil, l), []int{memfd(t, layout.Size(), true), b[0], b[1]}, nil
		}, "dial=-71 "},
		{"two descriptors", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size(), true), b[0]}, nil
		}, "dial=-71 "},
		{"doorbell not a stream", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size(), true), b[0], p[0]}, nil
		}, "dial=-71 "},
		{"ring tail lies", func(t *testing.T) ([]byte, []int, func()) {
			mine, b := bells(t)
			fd := memfd(t, layout.Size(), true)
			mem, err := unix.Mmap(fd, 0, layout.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
			t.Cleanup(func() { _ = unix.Munmap(mem) })
			return shm.AppendLayout(nil, layout), []int{fd, b[0], b[1]}, func() {
				rx := mem[layout.Size()/2:]
				binary.LittleEndian.PutUint32(rx, 1000) // tail: 1000 descriptors in a ring of 256
				_, _ = unix.Write(mine[1], []byte{1})
			}
		}, "recv=-71 "},
		{"descriptor outside the slab", func(t *testing.T) ([]byte, []int, func()) {
			mine, b := bells(t)
			fd := memfd(t, layout.Size(), true)
			mem, err := unix.Mmap(fd, 0, layout.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
			t.Cleanup(func() { _ = unix.Munmap(mem) })
			return shm.AppendLayout(nil, layout), []int{fd, b[0], b[1]}, func() {
				rx := mem[layout.Size()/2:]
				d := rx[256:]
				binary.LittleEndian.PutUint32(d, layout.Slab-8) // off
				binary.LittleEndian.PutUint32(d[4:], 4096)      // len: past the slab's end
				binary.LittleEndian.PutUint32(rx, 1)            // tail
				_, _ = unix.Write(mine[1], []byte{1})
			}
		}, "recv=-71 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeAgent(t, func(c *net.UnixConn) {
				b := make([]byte, frame.MaxFrame)
				var after func()
				for {
					n, err := c.Read(b)
					if err != nil || n == 0 {
						return
					}
					f, err := frame.Decode(b[:n])
					if err != nil {
						return
					}
					var rep frame.Frame
					var fds []int
					switch f.Op {
					case frame.OpHello:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: frame.Version,
							Payload: frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "fake"})}
					case frame.OpDial:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: 1, Payload: f.Payload}
					case frame.OpShm:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: 1}
						rep.Payload, fds, after = tc.segment(t)
					default:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle}
					}
					if f.Op == frame.OpGrant {
						continue
					}
					out := encode(t, rep)
					var oob []byte
					if len(fds) > 0 {
						oob = unix.UnixRights(fds...)
					}
					_, _, err = c.WriteMsgUnix(out, oob, nil)
					for _, fd := range fds {
						_ = unix.Close(fd)
					}
					if err != nil {
						return
					}
					if after != nil {
						after()
						after = nil
					}
				}
			})
			out := runC(t, "test_fakeagent", "VCONN_SOCK="+sock, "VCONN_SHM=1")
			if !strings.Contains(out, tc.want) {
				t.Fatalf("want %q in the output", tc.want)
			}
		})
	}
}

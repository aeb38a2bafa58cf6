package ladder_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
	"github.com/rdmavisor/rdmavisor/test/ladder/ladderproto"
)

// client is a path's client side, connected to its server.
type client interface {
	pingPong(size, inflight, count int) (time.Duration, []time.Duration, error)
	stream(size, count int) (time.Duration, error)
	// quit ends the server and says how it ended.
	quit() error
}

// path is one way a program reaches its peer: start sets up its server
// (on node-b for the vconn paths) and a client connected to it (on
// node-a).
type path struct {
	name  string
	start func(h *harness) (client, error)
	// extra paths run only when RDMAVISOR_E6_PATHS names them.
	extra bool
}

// paths are the ladder's rungs, in the order of the tables.
var paths = []path{
	{name: "engine", start: (*harness).engine},
	{name: "shm", start: func(h *harness) (client, error) { return h.sdk("shm", 7602, true) }},
	{name: "socket", start: func(h *harness) (client, error) { return h.sdk("socket", 7601, false) }},
	{name: "shm-proc", start: func(h *harness) (client, error) { return h.goladder("shm-proc", 7608, true) }},
	{name: "socket-proc", start: func(h *harness) (client, error) { return h.goladder("socket-proc", 7609, false) }},
	{name: "libvconn", start: func(h *harness) (client, error) { return h.libvconn("libvconn", 7603, false) }},
	{name: "libvconn-shm", start: func(h *harness) (client, error) { return h.libvconn("libvconn-shm", 7604, true) }, extra: true},
	{name: "preload", start: (*harness).preload},
	{name: "python", start: (*harness).python},
	{name: "tcp", start: (*harness).tcp},
	{name: "tcp-c", start: (*harness).tcpC},
}

// goClient is the client of a path whose both ends are goroutines of the
// test: the Go protocol code of package ladderproto over c.
type goClient struct {
	c    ladderproto.Conn
	done chan error // the server's end
}

func (g *goClient) pingPong(size, inflight, count int) (time.Duration, []time.Duration, error) {
	return ladderproto.PingPong(g.c, size, inflight, count)
}

func (g *goClient) stream(size, count int) (time.Duration, error) {
	return ladderproto.Stream(g.c, size, count)
}

func (g *goClient) quit() error {
	if err := g.c.Put(ladderproto.Header(ladderproto.OpQuit, 0, 0)); err != nil {
		return err
	}
	select {
	case err := <-g.done:
		return err
	case <-time.After(time.Minute):
		return errors.New("the server did not end")
	}
}

func goPath(c, s ladderproto.Conn) *goClient {
	g := &goClient{c: c, done: make(chan error, 1)}
	go func() { g.done <- ladderproto.Serve(s) }()
	return g
}

// engConn is a vconn of an engine called directly.
type engConn struct {
	ctx context.Context
	vc  *engine.VConn
}

func (e engConn) Put(b []byte) error { return e.vc.Send(e.ctx, b) }

func (e engConn) Get(b []byte) error {
	m, err := e.vc.Recv(e.ctx)
	if err != nil {
		return err
	}
	defer m.Release()
	if len(m.Data) != len(b) {
		return fmt.Errorf("a message of %d bytes, want %d", len(m.Data), len(b))
	}
	copy(b, m.Data)
	return nil
}

// streamConn is a byte stream: a message is a write, read back whole.
type streamConn struct{ c net.Conn }

func (s streamConn) Put(b []byte) error {
	_, err := s.c.Write(b)
	return err
}

func (s streamConn) Get(b []byte) error {
	_, err := io.ReadFull(s.c, b)
	return err
}

// engine connects two engines called directly, configured as the agents'
// (their configuration as the agents made it), each on its own soft
// device on UDP on node-a's and node-b's addresses: enginePair of
// pkg/vconn's E4, on the agents' settings.
func (h *harness) engine() (client, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.2:0")
	if err != nil {
		return nil, err
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	_ = pc.Close()
	open := func(ip string) (*engine.Engine, error) {
		dev, err := soft.OpenUDP(ip, port)
		if err != nil {
			return nil, err
		}
		cfg := h.engineCfg
		cfg.Device, cfg.Log = dev, logr.Discard()
		e, err := engine.New(cfg)
		if err != nil {
			_ = dev.Close()
			return nil, err
		}
		h.t.Cleanup(func() { _ = e.Close(); _ = dev.Close() })
		return e, nil
	}
	ea, err := open("127.0.0.2")
	if err != nil {
		return nil, err
	}
	eb, err := open("127.0.0.3")
	if err != nil {
		return nil, err
	}
	o := engine.VConnOptions{UseEngineDefault: true}
	va, vb, err := engine.Pair(h.ctx, ea, eb, o, o)
	if err != nil {
		return nil, err
	}
	if va.Transport() != h.engineCfg.Transport {
		return nil, fmt.Errorf("engine vconn on %v, the agents' on %v", va.Transport(), h.engineCfg.Transport)
	}
	h.t.Cleanup(func() { _ = va.Close(); _ = vb.Close() })
	return goPath(engConn{h.ctx, va}, engConn{h.ctx, vb}), nil
}

// sdk connects two clients of package vconn, on the socket or on shared
// memory: node-a dials node-b:port.
func (h *harness) sdk(name string, port int, shm bool) (client, error) {
	open := func(node int, id string) (*vconn.Client, error) {
		sock, err := h.cl.Nodes[node].Allocate(h.ctx, id, 4)
		if err != nil {
			return nil, err
		}
		c, err := vconn.NewClient(h.ctx, vconn.Options{Socket: sock, SharedMemory: shm, Resolver: h.cl.Hosts})
		if err != nil {
			return nil, err
		}
		h.t.Cleanup(func() { _ = c.Close() })
		return c, nil
	}
	srv, err := open(1, name+"-server")
	if err != nil {
		return nil, err
	}
	cli, err := open(0, name+"-client")
	if err != nil {
		return nil, err
	}
	ln, err := srv.Listen(h.ctx, fmt.Sprintf(":%d", port))
	if err != nil {
		return nil, err
	}
	h.t.Cleanup(func() { _ = ln.Close() })
	c, err := cli.Dial(h.ctx, fmt.Sprintf("node-b:%d", port))
	if err != nil {
		return nil, err
	}
	s, err := ln.AcceptVConn()
	if err != nil {
		return nil, err
	}
	h.t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	if shm {
		// Package vconn does not say whether a vconn is on shared
		// memory; the agent names each vconn's segment after its
		// allocation, and both clients map theirs here.
		for _, id := range []string{name + "-server", name + "-client"} {
			if !mapped("rdmavisor-" + id + "-") {
				return nil, fmt.Errorf("allocation %s's vconn is not on shared memory (no memfd rdmavisor-%s-* mapped)", id, id)
			}
		}
	}
	return goPath(ladderproto.SDK{Ctx: h.ctx, C: c}, ladderproto.SDK{Ctx: h.ctx, C: s}), nil
}

// mapped says whether this process maps a memfd whose name starts with
// prefix.
func mapped(prefix string) bool {
	b, err := os.ReadFile("/proc/self/maps")
	return err == nil && strings.Contains(string(b), "/memfd:"+prefix)
}

// tcp is Go's net on loopback.
func (h *harness) tcp() (client, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	s, err := ln.Accept()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	h.t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return goPath(streamConn{c}, streamConn{s}), nil
}

// libvconn runs clib/test/ladder.c as the server on node-b and the client
// on node-a.
func (h *harness) libvconn(name string, port int, shm bool) (client, error) {
	return h.program(name, "ladder", port, shm)
}

// goladder runs test/ladder/goladder, package vconn in processes of their
// own, as pods' programs are, where the paths shm and socket run in the
// test's process beside the agents.
func (h *harness) goladder(name string, port int, shm bool) (client, error) {
	return h.program(name, "goladder", port, shm)
}

// program runs a ladder program of h.bin speaking ladder.h over a vconn:
// its server on node-b, its client on node-a.
func (h *harness) program(name, bin string, port int, shm bool) (client, error) {
	var extra []string
	if shm {
		extra = []string{"shm"}
	}
	srv, err := h.alloc(1, name+"-server")
	if err != nil {
		return nil, err
	}
	cli, err := h.alloc(0, name+"-client")
	if err != nil {
		return nil, err
	}
	prog := filepath.Join(h.bin, bin)
	sp, _, err := h.server(name, []string{"RDMAVISOR_SOCKET=" + srv}, prog, append([]string{"server", fmt.Sprintf(":%d", port)}, extra...)...)
	if err != nil {
		return nil, err
	}
	return h.procClient(sp, name, []string{"RDMAVISOR_SOCKET=" + cli}, prog, append([]string{"client", fmt.Sprintf("node-b:%d", port)}, extra...)...)
}

// preload runs clib/test/ladder_tcp.c, plain TCP, under the preload
// library: the server listens on node-b's IP, the client connects to it.
func (h *harness) preload() (client, error) {
	const port = 7605
	srv, err := h.alloc(1, "preload-server")
	if err != nil {
		return nil, err
	}
	cli, err := h.alloc(0, "preload-client")
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("%s:%d", h.cl.Nodes[1].IP, port)
	lib := "LD_PRELOAD=" + filepath.Join(h.bin, "librdmavisor-preload.so")
	prog := filepath.Join(h.bin, "ladder_tcp")
	sp, _, err := h.server("preload", []string{lib, "RDMAVISOR_SOCKET=" + srv, "RDMAVISOR_PRELOAD_LISTEN=" + strconv.Itoa(port)}, prog, "server", addr)
	if err != nil {
		return nil, err
	}
	return h.procClient(sp, "preload", []string{lib, "RDMAVISOR_SOCKET=" + cli, "RDMAVISOR_PRELOAD_CONNECT=" + addr}, prog, "client", addr)
}

// tcpC is the same program over TCP on loopback.
func (h *harness) tcpC() (client, error) {
	prog := filepath.Join(h.bin, "ladder_tcp")
	sp, addr, err := h.server("tcp-c", nil, prog, "server", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return h.procClient(sp, "tcp-c", nil, prog, "client", addr)
}

// python runs test/ladder/ladder.py with the package from python/.
func (h *harness) python() (client, error) {
	const port = 7606
	srv, err := h.alloc(1, "python-server")
	if err != nil {
		return nil, err
	}
	cli, err := h.alloc(0, "python-client")
	if err != nil {
		return nil, err
	}
	env := []string{"PYTHONPATH=" + filepath.Join(h.repo, "python"), "PYTHONDONTWRITEBYTECODE=1"}
	script := filepath.Join(h.repo, "test", "ladder", "ladder.py")
	sp, _, err := h.server("python", append(env, "RDMAVISOR_SOCKET="+srv), h.py, script, "server", strconv.Itoa(port))
	if err != nil {
		return nil, err
	}
	return h.procClient(sp, "python", append(env, "RDMAVISOR_SOCKET="+cli), h.py, script, "client", fmt.Sprintf("node-b:%d", port))
}

func (h *harness) alloc(node int, id string) (string, error) {
	return h.cl.Nodes[node].Allocate(h.ctx, id, 4)
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() < 64<<10 {
		b.b.Write(p)
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// command makes a process of the test, in its own process group, killed
// at the end.
func (h *harness) command(env []string, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

func (h *harness) reap(what string, cmd *exec.Cmd, out *syncBuffer) {
	h.t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		if h.t.Failed() {
			h.t.Logf("%s's output:\n%s", what, out.String())
		}
	})
}

// serverProc is a path's server program.
type serverProc struct {
	cmd *exec.Cmd
	out *syncBuffer
}

// server starts a path's server and waits for its "ready ADDR" line: the
// address it listens on.
func (h *harness) server(name string, env []string, prog string, args ...string) (*serverProc, string, error) {
	cmd := h.command(env, prog, args...)
	var errOut syncBuffer
	cmd.Stderr = &errOut
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	h.reap(name+" server", cmd, &errOut)
	ready := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		ready <- line
		_, _ = io.Copy(&errOut, r)
	}()
	select {
	case line := <-ready:
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != "ready" {
			time.Sleep(100 * time.Millisecond) // its stderr
			return nil, "", fmt.Errorf("%s server: %q, not ready: %s", name, line, errOut.String())
		}
		return &serverProc{cmd, &errOut}, f[1], nil
	case <-time.After(30 * time.Second):
		return nil, "", fmt.Errorf("%s server not ready after 30s: %s", name, errOut.String())
	}
}

// proc is the client of a path that is a program: it sends the commands
// of ladder.h on the program's stdin and reads its answers.
type proc struct {
	h      *harness
	name   string
	cmd    *exec.Cmd
	srv    *serverProc
	in     io.WriteCloser
	out    *bufio.Reader
	errOut *syncBuffer
}

func (h *harness) procClient(srv *serverProc, name string, env []string, prog string, args ...string) (client, error) {
	cmd := h.command(env, prog, args...)
	p := &proc{h: h, name: name, cmd: cmd, srv: srv, errOut: &syncBuffer{}}
	cmd.Stderr = p.errOut
	var err error
	if p.in, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewReaderSize(stdout, 1<<20)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h.reap(name+" client", cmd, p.errOut)
	return p, nil
}

// stuckAfter is how long a command may take before its program is
// killed.
const stuckAfter = 5 * time.Minute

// do runs one command: the numbers of its "ok" answer.
func (p *proc) do(command string) ([]int64, error) {
	// A program that hangs is killed, which ends the read. Said so in
	// the error: the kill closes its vconn, and its peer then reads EOF
	// wherever it was, which looks like a stream cut short.
	var killed atomic.Bool
	dump := make(chan string, 1)
	stuck := time.AfterFunc(stuckAfter, func() {
		killed.Store(true) // first: the SIGQUIT may end the read
		dump <- p.dumpStuck()
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	})
	defer stuck.Stop()
	if _, err := io.WriteString(p.in, command+"\n"); err != nil {
		return nil, p.failed(command, err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		if killed.Load() {
			err = fmt.Errorf("no answer in %v, killed (its peer reads EOF then; where everything waited: %s): %w", stuckAfter, <-dump, err)
		}
		return nil, p.failed(command, err)
	}
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "ok" {
		return nil, p.failed(command, fmt.Errorf("answer %.100q", line))
	}
	v := make([]int64, len(f)-1)
	for i, s := range f[1:] {
		if v[i], err = strconv.ParseInt(s, 10, 64); err != nil || v[i] <= 0 {
			return nil, p.failed(command, fmt.Errorf("answer %.100q: %q is no duration", line, s))
		}
	}
	return v, nil
}

// dumpStuck writes, before a stuck program is killed, where everything
// waits into a file it names: this process's goroutines (the agents run
// here) and the engines' counters. The client and server programs get a
// SIGQUIT first, on which Go's runtime prints their goroutines to the
// stderr the test keeps (others die of it).
func (p *proc) dumpStuck() string {
	for _, c := range []*exec.Cmd{p.cmd, p.srv.cmd} {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGQUIT)
	}
	f, err := os.CreateTemp("", "e6-stuck-*.txt")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	for _, n := range p.h.cl.Nodes {
		e := n.Agent.Engine()
		fmt.Fprintf(f, "%s's engine: %+v; refused by reason: %v\n", n.Name, e.Stats(), e.RejectStats())
	}
	_ = pprof.Lookup("goroutine").WriteTo(f, 2)
	time.Sleep(time.Second) // the programs' stacks
	return f.Name()
}

func (p *proc) failed(command string, err error) error {
	time.Sleep(100 * time.Millisecond) // the rest of its stderr
	return fmt.Errorf("%s client, %q: %w; its stderr: %s", p.name, command, err, p.errOut.String())
}

func (p *proc) pingPong(size, inflight, count int) (time.Duration, []time.Duration, error) {
	v, err := p.do(fmt.Sprintf("pp %d %d %d", size, inflight, count))
	if err != nil {
		return 0, nil, err
	}
	if len(v) != count+1 {
		return 0, nil, fmt.Errorf("%s client: %d round trips, want %d", p.name, len(v)-1, count)
	}
	rtt := make([]time.Duration, count)
	for i := range rtt {
		rtt[i] = time.Duration(v[i+1])
	}
	return time.Duration(v[0]), rtt, nil
}

func (p *proc) stream(size, count int) (time.Duration, error) {
	v, err := p.do(fmt.Sprintf("st %d %d", size, count))
	if err != nil {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("%s client: %d numbers, want 1", p.name, len(v))
	}
	return time.Duration(v[0]), nil
}

func (p *proc) quit() error {
	if _, err := io.WriteString(p.in, "quit\n"); err != nil {
		return p.failed("quit", err)
	}
	for _, x := range []struct {
		what string
		cmd  *exec.Cmd
		out  *syncBuffer
	}{{"client", p.cmd, p.errOut}, {"server", p.srv.cmd, p.srv.out}} {
		done := make(chan error, 1)
		go func() { done <- x.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("%s %s: %w; its output: %s", p.name, x.what, err, x.out.String())
			}
		case <-time.After(time.Minute):
			return fmt.Errorf("%s %s did not exit", p.name, x.what)
		}
	}
	return nil
}

// Package protocol is the conformance suite of the pod protocol: every
// rule docs/protocol.md labels ([R3.2]...) has a case here that speaks
// raw frames to real agents (internal/agent/agenttest: node-a and node-b
// in this process), with no SDK between. TestConformance runs the cases,
// TestRulesHaveCases holds the table and the document to each other.
package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// The clusters the cases run on, started on first use and shared by the
// cases of a run (each case takes its own allocations and ports).
const (
	// rc: the default transport; few engine credits (a peer that does
	// not read stops its sender soon), and small allocation limits.
	clusterRC = "rc"
	// ud: vconns on UD, whose messages are one MTU.
	clusterUD = "ud"
	// queued: node-a's allocations have the least limits.queuedBytes.
	clusterQueued = "queued"
)

// Allocation limits of the rc cluster.
const (
	limitSessions  = 4
	limitListeners = 4
	limitRegions   = 4
)

var clusters struct {
	mu sync.Mutex
	m  map[string]*agenttest.Cluster
}

func clusterOptions(kind string) (agenttest.Options, error) {
	credits := func(c *engine.Config) { c.Credits = 8 }
	switch kind {
	case clusterRC:
		return agenttest.Options{VConnsPerNode: 1000, TuneEngine: credits, TuneConfig: func(c *config.AgentConfig) {
			c.Limits.Sessions, c.Limits.Listeners, c.Limits.Regions = limitSessions, limitListeners, limitRegions
		}}, nil
	case clusterUD:
		return agenttest.Options{VConnsPerNode: 1000, Transport: config.TransportUD}, nil
	case clusterQueued:
		return agenttest.Options{VConnsPerNode: 1000, TuneEngine: credits, TuneConfig: func(c *config.AgentConfig) {
			if c.NodeName == "node-a" {
				c.Limits.QueuedBytes = config.MinQueuedBytes
			}
		}}, nil
	}
	return agenttest.Options{}, fmt.Errorf("no cluster %q", kind)
}

// cluster returns the shared cluster of kind, starting it on first use.
func cluster(t *testing.T, kind string) *agenttest.Cluster {
	t.Helper()
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	if c := clusters.m[kind]; c != nil {
		return c
	}
	o, err := clusterOptions(kind)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agenttest.Start(o)
	if err != nil {
		t.Fatalf("start the %s cluster: %v", kind, err)
	}
	if clusters.m == nil {
		clusters.m = map[string]*agenttest.Cluster{}
	}
	clusters.m[kind] = c
	return c
}

// ownCluster starts a cluster for one case only (one it breaks).
func ownCluster(t *testing.T, o agenttest.Options) *agenttest.Cluster {
	t.Helper()
	if testing.Verbose() {
		o.Log = testr.NewWithInterface(t, testr.Options{})
	}
	c, err := agenttest.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close the cluster: %v", err)
		}
	})
	return c
}

func TestMain(m *testing.M) {
	code := m.Run()
	for kind, c := range clusters.m {
		if err := c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "close the %s cluster: %v\n", kind, err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is what a case runs with: its cluster, node-a and node-b.
type env struct {
	cl   *agenttest.Cluster
	a, b *agenttest.Node
}

var (
	allocs atomic.Int64
	ports  atomic.Uint32
)

// port is a port no other case of the run uses (the host services of a
// node share its port space).
func port() uint32 { return 10000 + ports.Add(1) }

// alloc makes a host services' allocation of k vconns on n: its socket.
func alloc(t *testing.T, n *agenttest.Node, k int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock, err := n.Allocate(ctx, fmt.Sprintf("conf%d", allocs.Add(1)), k)
	if err != nil {
		t.Fatal(err)
	}
	return sock
}

// podAlloc registers a pod with ip on n and makes an allocation of k
// vconns bound to it: its socket.
func podAlloc(t *testing.T, n *agenttest.Node, ip string, k int) string {
	t.Helper()
	id := fmt.Sprintf("pod%d", allocs.Add(1))
	if err := n.Agent.RegisterPod(admin.Pod{UID: "uid-" + id, Namespace: "conf", Name: id, IPs: []string{ip}}); err != nil {
		t.Fatal(err)
	}
	al, err := n.Agent.CreatePodAllocation(id, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Agent.BindAllocation(id, "conf", id); err != nil {
		t.Fatal(err)
	}
	return al.Socket
}

// sess is a raw session: frames written and read one datagram each.
type sess struct {
	t    *testing.T
	name string
	sock string // the allocation's socket
	c    *net.UnixConn
	req  uint32 // the last req used by next
}

// dial connects to an allocation's socket, without a Hello.
func dial(t *testing.T, name, sock string) *sess {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatalf("%s: connect: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &sess{t: t, name: name, sock: sock, c: c, req: 100}
}

// open connects and says Hello: the session of a client.
func open(t *testing.T, name, sock string) *sess {
	t.Helper()
	s := dial(t, name, sock)
	s.send(frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	s.expectOK(1, 0)
	return s
}

// next is a req the session has not used.
func (s *sess) next() uint32 { s.req++; return s.req }

func (s *sess) send(f frame.Frame) {
	s.t.Helper()
	b, err := frame.Append(nil, &f)
	if err != nil {
		s.t.Fatal(err)
	}
	s.sendRaw(b)
}

func (s *sess) sendRaw(b []byte) {
	s.t.Helper()
	if _, err := s.c.Write(b); err != nil {
		s.t.Fatalf("%s: write: %v", s.name, err)
	}
}

// msg is one datagram of the agent.
type msg struct {
	frame.Frame
	size int        // the datagram's length
	fds  []*os.File // its SCM_RIGHTS
}

func (m msg) String() string {
	s := fmt.Sprintf("%v req=%d handle=%d arg=%d arg2=%#x flags=%d", m.Op, m.Req, m.Handle, m.Arg, m.Arg2, m.Flags)
	if m.Op == frame.OpError {
		s += fmt.Sprintf(" (%v: %s)", frame.Code(m.Arg), m.Payload)
	}
	return s
}

var errQuiet = errors.New("nothing came")

// read reads one datagram within d: errQuiet if none came, io.EOF-like
// errors when the agent closed. Every datagram is checked as R2.1 says:
// it decodes, its flags are its op's.
func (s *sess) read(d time.Duration) (msg, error) {
	s.t.Helper()
	_ = s.c.SetReadDeadline(time.Now().Add(d))
	buf, oob := make([]byte, frame.MaxFrame+1), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := s.c.ReadMsgUnix(buf, oob)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return msg{}, errQuiet
	}
	if err != nil {
		return msg{}, err
	}
	if n == 0 {
		return msg{}, errClosed
	}
	m := msg{size: n}
	if oobn > 0 {
		cms, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			s.t.Fatalf("%s: control message: %v", s.name, err)
		}
		for i := range cms {
			fds, err := unix.ParseUnixRights(&cms[i])
			if err != nil {
				s.t.Fatalf("%s: rights: %v", s.name, err)
			}
			for _, fd := range fds {
				f := os.NewFile(uintptr(fd), "rights")
				s.t.Cleanup(func() { _ = f.Close() })
				m.fds = append(m.fds, f)
			}
		}
	}
	if flags&unix.MSG_TRUNC != 0 || n > frame.MaxFrame {
		s.t.Fatalf("%s: R1.2: a datagram of more than %d bytes", s.name, frame.MaxFrame)
	}
	f, err := frame.Decode(buf[:n])
	if err != nil {
		s.t.Fatalf("%s: R2.1: the agent sent a datagram that fails the checks: %v", s.name, err)
	}
	if f.Flags&^frame.FlagImm != 0 || (f.Flags&frame.FlagImm != 0 && f.Op != frame.OpData) {
		s.t.Fatalf("%s: R2.1: the agent sent %v with flags %#x", s.name, f.Op, f.Flags)
	}
	f.Payload = append([]byte(nil), f.Payload...)
	m.Frame = f
	return m, nil
}

var errClosed = errors.New("the agent closed the session")

// recvFDs reads the next datagram, which must carry n descriptors (R1.3).
func (s *sess) recvFDs(n int) msg {
	s.t.Helper()
	m, err := s.read(10 * time.Second)
	if err != nil {
		s.t.Fatalf("%s: read: %v", s.name, err)
	}
	if len(m.fds) != n {
		s.t.Fatalf("%s: R1.3: %v carries %d descriptors, want %d", s.name, m, len(m.fds), n)
	}
	return m
}

// recv reads the next datagram, which carries no descriptor (R1.3).
func (s *sess) recv() msg {
	s.t.Helper()
	return s.recvFDs(0)
}

func (s *sess) expectOK(req, handle uint32) msg {
	s.t.Helper()
	m := s.recv()
	if m.Op != frame.OpOK || m.Req != req || m.Handle != handle {
		s.t.Fatalf("%s: got %v, want OK req=%d handle=%d", s.name, m, req, handle)
	}
	return m
}

func (s *sess) expectErr(req, handle uint32, c frame.Code) msg {
	s.t.Helper()
	m := s.recv()
	if m.Op != frame.OpError || m.Req != req || m.Handle != handle || frame.Code(m.Arg) != c || len(m.Payload) == 0 {
		s.t.Fatalf("%s: got %v, want Error req=%d handle=%d code %v with a message", s.name, m, req, handle, c)
	}
	return m
}

// call sends a request and reads its OK; the caller knows nothing else
// comes on the session meanwhile.
func (s *sess) call(f frame.Frame) msg {
	s.t.Helper()
	if f.Req == 0 {
		f.Req = s.next()
	}
	s.send(f)
	switch f.Op {
	case frame.OpHello, frame.OpListen, frame.OpDial: // their OKs carry their own handle (R3.4)
		m := s.recv()
		if m.Op != frame.OpOK || m.Req != f.Req {
			s.t.Fatalf("%s: %v: got %v, want OK req=%d", s.name, f.Op, m, f.Req)
		}
		return m
	}
	return s.expectOK(f.Req, f.Handle)
}

// fails sends a request and reads its Error of code c.
func (s *sess) fails(f frame.Frame, c frame.Code) msg {
	s.t.Helper()
	if f.Req == 0 {
		f.Req = s.next()
	}
	s.send(f)
	return s.expectErr(f.Req, f.Handle, c)
}

// expectClosed: the session's next read is its end.
func (s *sess) expectClosed() {
	s.t.Helper()
	m, err := s.read(10 * time.Second)
	switch {
	case err == nil:
		s.t.Fatalf("%s: got %v, want the session closed", s.name, m)
	case errors.Is(err, errQuiet):
		s.t.Fatalf("%s: the session is still open", s.name)
	}
}

// expectQuiet: nothing arrives within d.
func (s *sess) expectQuiet(d time.Duration) {
	s.t.Helper()
	if m, err := s.read(d); err == nil {
		s.t.Fatalf("%s: got %v, want nothing", s.name, m)
	} else if !errors.Is(err, errQuiet) {
		s.t.Fatalf("%s: %v, want the session open and quiet", s.name, err)
	}
}

// alive: the session still answers (a Hello again, R3.6).
func (s *sess) alive() {
	s.t.Helper()
	req := s.next()
	s.send(frame.Frame{Op: frame.OpHello, Req: req, Arg: frame.Version})
	s.expectOK(req, 0)
}

// endsWith: the session's last frame is an Error of code c with req and
// handle 0, then it closes.
func (s *sess) endsWith(req uint32, c frame.Code) msg {
	s.t.Helper()
	m := s.expectErr(req, 0, c)
	s.expectClosed()
	return m
}

func (s *sess) listen(p uint32) uint32 {
	s.t.Helper()
	return s.call(frame.Frame{Op: frame.OpListen, Arg: p}).Handle
}

// dialVConn dials addr and returns the OK.
func (s *sess) dialVConn(addr string) msg {
	s.t.Helper()
	req := s.next()
	s.send(frame.Frame{Op: frame.OpDial, Req: req, Payload: []byte(addr)})
	m := s.recv()
	if m.Op != frame.OpOK || m.Req != req || m.Handle == 0 {
		s.t.Fatalf("%s: dial %s: %v", s.name, addr, m)
	}
	return m
}

// accept reads the Accept of listener l.
func (s *sess) accept(l uint32) msg {
	s.t.Helper()
	m := s.recv()
	if m.Op != frame.OpAccept || m.Handle != l || m.Arg == 0 {
		s.t.Fatalf("%s: got %v, want an Accept on listener %d", s.name, m, l)
	}
	return m
}

// pair is a vconn from a session on node-a (A, handle ha) to a listener
// (l) of a session on node-b (B, handle hb).
type pair struct {
	A, B   *sess
	ha, hb uint32
	l      uint32
	addr   string
}

// newPair dials from a new session on node-a to a new listener on node-b.
func newPair(t *testing.T, e *env) *pair {
	t.Helper()
	p := &pair{A: open(t, "A", alloc(t, e.a, 8)), B: open(t, "B", alloc(t, e.b, 8))}
	port := port()
	p.l = p.B.listen(port)
	p.addr = fmt.Sprintf("node-b:%d", port)
	p.ha = p.A.dialVConn(p.addr).Handle
	p.hb = p.B.accept(p.l).Arg
	return p
}

// sendMsg sends a message on h and reads its OK.
func (s *sess) sendMsg(h uint32, b []byte) {
	s.t.Helper()
	s.call(frame.Frame{Op: frame.OpSend, Handle: h, Payload: b})
}

// data reads a Data push of handle h.
func (s *sess) data(h uint32) msg {
	s.t.Helper()
	m := s.recv()
	if m.Op != frame.OpData || m.Handle != h || m.Req != 0 {
		s.t.Fatalf("%s: got %v, want Data on %d", s.name, m, h)
	}
	return m
}

// inUse is how many vconns allocation of sock holds on n.
func inUse(n *agenttest.Node, sock string) int {
	for _, al := range n.Agent.Allocations() {
		if strings.Contains(sock, "/"+al.ID+"/") {
			return al.InUse
		}
	}
	return -1
}

func length(n uint32) []byte { return frame.AppendLength(nil, n) }

// staged is a vconn's staging memory as the OK of Stage gave it.
type staged struct {
	fd   int
	size int
}

// stage asks for size bytes of staging memory on vconn h and checks the
// OK: one descriptor, a memfd of at least the size given.
func stage(t *testing.T, s *sess, h uint32, size uint64) staged {
	t.Helper()
	req := s.next()
	s.send(frame.Frame{Op: frame.OpStage, Req: req, Handle: h, Arg2: size})
	m := s.recvFDs(1)
	if m.Op != frame.OpOK || m.Req != req || m.Handle != h || m.Arg2 == 0 || m.Arg2 > size {
		t.Fatalf("Stage of %d bytes: %v", size, m)
	}
	st := staged{fd: int(m.fds[0].Fd()), size: int(m.Arg2)}
	var fs unix.Stat_t
	if err := unix.Fstat(st.fd, &fs); err != nil || fs.Size < int64(st.size) {
		t.Fatalf("the staging memfd: %d bytes, %v; want at least %d", fs.Size, err, st.size)
	}
	return st
}

// mmap maps the staging memory, unmapped at the end of the test.
func (st staged) mmap(t *testing.T) []byte {
	t.Helper()
	mem, err := unix.Mmap(st.fd, 0, st.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return mem
}

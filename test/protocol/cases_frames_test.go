package protocol

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

func helloBytes(req uint32) []byte {
	b, _ := frame.Append(nil, &frame.Frame{Op: frame.OpHello, Req: req, Arg: frame.Version})
	return b
}

func sockType(t *testing.T, m msg, i int) int {
	t.Helper()
	typ, err := unix.GetsockoptInt(int(m.fds[i].Fd()), unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		t.Fatalf("descriptor %d of %v: %v", i, m, err)
	}
	return typ
}

// §1 The socket.
var socketCases = []conformanceCase{
	{"R1.1", "a SOCK_SEQPACKET socket, one frame a datagram", rc, false, func(t *testing.T, e *env) {
		sock := alloc(t, e.a, 1)
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err == nil {
			t.Fatal("a SOCK_STREAM socket connected to the allocation's socket")
		}
		s := dial(t, "A", sock)
		s.sendRaw(helloBytes(1))
		s.sendRaw(helloBytes(2))
		s.expectOK(1, 0)
		s.expectOK(2, 0)
		// Two frames in one datagram are one datagram whose length is wrong.
		s.sendRaw(append(helloBytes(3), helloBytes(4)...))
		s.endsWith(3, frame.CodeBadRequest)
	}},
	{"R1.2", "no datagram is longer than 65,564 bytes; a LocalRead of 65,536 is exactly that", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 1 << 20}).Arg
		m := p.A.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Arg2: 4096, Payload: length(frame.MaxPayload)})
		if m.size != frame.MaxFrame || len(m.Payload) != frame.MaxPayload {
			t.Fatalf("a LocalRead of %d bytes: a datagram of %d bytes, want %d", frame.MaxPayload, m.size, frame.MaxFrame)
		}
	}},
	{"R1.3", "descriptors come with Shm's OK (memfd, TX and RX doorbells), bridged OKs and Accepts (a stream socket) a FlagMemfd Export's OK and Stage's OK (a memfd) only", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e) // the plain OK and Accept carried none: recv checks
		openShm(t, p.A, p.ha)
		p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}) // none without FlagMemfd
		ereq := p.A.next()
		p.A.send(frame.Frame{Op: frame.OpExport, Req: ereq, Handle: p.ha, Flags: frame.FlagMemfd, Arg: 3, Arg2: 64})
		if m := p.A.recvFDs(1); m.Op != frame.OpOK || m.Req != ereq {
			t.Fatalf("Export with FlagMemfd: %v", m)
		}
		stage(t, p.A, p.ha, 4096)
		// A bridged listener, and a bridged Dial to it.
		bl := p.B.call(frame.Frame{Op: frame.OpListen, Flags: frame.FlagBridge, Arg: port()})
		addr := string(bl.Payload)
		req := p.A.next()
		p.A.send(frame.Frame{Op: frame.OpDial, Req: req, Flags: frame.FlagBridge, Payload: []byte(addr)})
		m := p.A.recvFDs(1)
		if m.Op != frame.OpOK || m.Req != req || sockType(t, m, 0) != unix.SOCK_STREAM {
			t.Fatalf("bridged dial: %v", m)
		}
		a := p.B.recvFDs(1)
		if a.Op != frame.OpAccept || a.Handle != bl.Handle || sockType(t, a, 0) != unix.SOCK_STREAM {
			t.Fatalf("bridged accept: %v", a)
		}
		// Every other frame: none (recv).
		p.A.sendMsg(p.ha, []byte("x"))
	}},
	{"R1.4", "another session of the same allocation cannot name a session's handles", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		s2 := open(t, "A2", p.A.sock)
		s2.fails(frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte("x")}, frame.CodeNoHandle)
		s2.fails(frame.Frame{Op: frame.OpClose, Handle: p.ha}, frame.CodeNoHandle)
		s3 := open(t, "B2", p.B.sock)
		s3.fails(frame.Frame{Op: frame.OpClose, Handle: p.l}, frame.CodeNoHandle)
		p.A.sendMsg(p.ha, []byte("still mine"))
	}},
	{"R1.5", "a session's end closes its vconns (the peer reads EOF, the quota is freed) and its listeners", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		sockA := p.A.sock
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 8})
		p.A.sendMsg(p.ha, []byte("before the end"))
		_ = p.A.c.Close()
		p.B.data(p.hb)
		if m := p.B.recv(); m.Op != frame.OpEOF || m.Handle != p.hb {
			t.Fatalf("got %v, want EOF on %d", m, p.hb)
		}
		poll.Until(t, 10*time.Second, "the quota freed", func() bool { return inUse(e.a, sockA) == 0 })
		// The listener goes with B's session.
		_ = p.B.c.Close()
		a := open(t, "A2", sockA)
		poll.Until(t, 10*time.Second, "the listener gone", func() bool {
			req := a.next()
			a.send(frame.Frame{Op: frame.OpDial, Req: req, Payload: []byte(p.addr)})
			m := a.recv()
			if m.Op == frame.OpOK {
				a.call(frame.Frame{Op: frame.OpClose, Handle: m.Handle})
				return false
			}
			if m.Op != frame.OpError || frame.Code(m.Arg) != frame.CodeRefused {
				t.Fatalf("dial of a listener whose session ended: %v, want CodeRefused", m)
			}
			return true
		})
	}},
}

// §2 Frames.
var frameCases = []conformanceCase{
	{"R2.1", "every frame of the agent passes the decoder's checks, with its op's flags", rc, false, func(t *testing.T, e *env) {
		// read checks every datagram; this case has the agent send each
		// kind of frame.
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 8})
		p.A.sendMsg(p.ha, []byte("plain"))
		p.A.call(frame.Frame{Op: frame.OpSend, Handle: p.ha, Flags: frame.FlagImm, Arg: 7, Payload: []byte("imm")})
		if m := p.B.data(p.hb); m.Flags != 0 || string(m.Payload) != "plain" {
			t.Fatalf("Data without an immediate: %v", m)
		}
		if m := p.B.data(p.hb); m.Flags != frame.FlagImm || m.Arg != 7 {
			t.Fatalf("Data with an immediate: %v", m)
		}
		p.A.fails(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: 9}, frame.CodeRegion)
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		if m := p.B.recv(); m.Op != frame.OpEOF || m.Handle != p.hb {
			t.Fatalf("got %v, want EOF", m)
		}
	}},
	{"R2.2", "the examples of §2, replayed", rc, false, replayExamples},
	{"R2.3", "each frame-invalid example is answered BadRequest naming its check, and ends the session", rc, false, func(t *testing.T, e *env) {
		raws, checks := invalidExamples(t)
		words := map[string]string{"short": "shorter", "version": "version", "op": "op", "flags": "flags", "too-big": "larger", "length": "length"}
		for i, raw := range raws {
			// An allocation each: a session the agent closes takes a
			// moment to leave the allocation's limits.sessions.
			sock := alloc(t, e.a, 2)
			other := open(t, "other", sock)
			s := open(t, "A", sock)
			s.sendRaw(raw)
			var req uint32
			if len(raw) >= 8 {
				req = binary.BigEndian.Uint32(raw[4:])
			}
			m := s.endsWith(req, frame.CodeBadRequest)
			if w := words[checks[i]]; w == "" || !strings.Contains(string(m.Payload), w) {
				t.Errorf("invalid example %d (%s): the reason %q does not name the check", i+1, checks[i], m.Payload)
			}
			other.alive() // other sessions are not affected
		}
	}},
}

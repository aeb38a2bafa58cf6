package protocol

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// replayExamples is R2.2: §2's frame blocks are one exchange between
// session A on node-a and session B on node-b; each block A or B sends is
// sent as its bytes, each the agent sends is read on that session and
// compared field by field (an Error's text excepted). What the document
// says happens between the blocks without showing it, the replay does:
// B's Hello, and B's Sends on vconn 3 until one fails with CodeReset.
func replayExamples(t *testing.T, e *env) {
	xs := examples(t)
	if len(xs) < 20 {
		t.Fatalf("%s: %d frame examples", protocolDoc, len(xs))
	}
	ss := map[string]*sess{
		"A": dial(t, "A", alloc(t, e.a, 4)), // its Hello is the first example
		"B": open(t, "B", alloc(t, e.b, 4)), // "B says Hello the same way (not shown)"
	}
	// Replies that carry descriptors: Shm's OK (3), a bridged Dial's (1).
	fds := map[string]map[uint32]int{"A": {}, "B": {}}
	for i, x := range xs {
		f := x.frameOf(t)
		switch {
		case x.to == "agent":
			s := ss[x.from]
			if s == nil {
				t.Fatalf("%s:%d: no session %q", protocolDoc, x.line, x.from)
			}
			if x.from == "B" && f.Op == frame.OpGrant && f.Handle == 3 {
				resetByPeer(t, s, f.Handle)
			}
			switch {
			case f.Op == frame.OpShm:
				fds[x.from][f.Req] = 3
			case f.Op == frame.OpDial && f.Flags&frame.FlagBridge != 0:
				fds[x.from][f.Req] = 1
			}
			s.sendRaw(x.raw)
		case x.from == "agent":
			s := ss[x.to]
			if s == nil {
				t.Fatalf("%s:%d: no session %q", protocolDoc, x.line, x.to)
			}
			n := 0
			if f.Op == frame.OpOK {
				n = fds[x.to][f.Req]
			}
			got := s.recvFDs(n)
			if !sameFrame(got.Frame, f) {
				t.Fatalf("%s:%d (example %d): %s got %v, the document shows %v req=%d handle=%d arg=%#x arg2=%#x payload=%q",
					protocolDoc, x.line, i+1, x.to, got, f.Op, f.Req, f.Handle, f.Arg, f.Arg2, f.Payload)
			}
			if n == 1 {
				if typ, err := unix.GetsockoptInt(int(got.fds[0].Fd()), unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
					t.Fatalf("%s:%d: the bridged vconn is no stream socket: %d %v", protocolDoc, x.line, typ, err)
				}
			}
		default:
			t.Fatalf("%s:%d: %s → %s: one side must be the agent", protocolDoc, x.line, x.from, x.to)
		}
	}
	// Nothing the document does not show came meanwhile on A.
	ss["A"].expectQuiet(200 * time.Millisecond)
	t.Logf("%d examples replayed", len(xs))
}

// resetByPeer sends on vconn h of s, whose peer closed it and which s
// never granted, one message at a time, until a Send fails with
// CodeReset (R8.33).
func resetByPeer(t *testing.T, s *sess, h uint32) {
	t.Helper()
	for i := 0; i < 200; i++ {
		req := s.next()
		s.send(frame.Frame{Op: frame.OpSend, Req: req, Handle: h, Payload: []byte("late")})
		m := s.recv()
		switch {
		case m.Op == frame.OpOK && m.Req == req:
			time.Sleep(20 * time.Millisecond)
		case m.Op == frame.OpError && m.Req == req && frame.Code(m.Arg) == frame.CodeReset:
			return
		default:
			t.Fatalf("%s: a Send to a closed peer: %v, want OK or CodeReset", s.name, m)
		}
	}
	t.Fatalf("%s: Sends to a closed peer never failed with CodeReset", s.name)
}

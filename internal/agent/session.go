package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// SendWindow is how many operations (Send, Export, Write, Read...) of one
// vconn a client may have unanswered.
const SendWindow = 16

// session is one application connection on an allocation's socket. Its
// handles name vconns and listeners of this connection only.
type session struct {
	al     *allocation
	conn   *net.UnixConn
	log    logr.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // dials, workers and pumps

	w frame.Writer // of conn

	mu        sync.Mutex
	next      uint32                  // last handle; guarded by mu
	vconns    map[uint32]*vconnHandle // guarded by mu
	listeners map[uint32]*listener    // guarded by mu
	shm       map[uint32]*shmVConn    // vconns on shared memory; guarded by mu
	closed    bool                    // guarded by mu
	hello     bool                    // reader-owned
	netns     uint64                  // the application's network namespace (inode), 0 if unknown
}

func newSession(al *allocation, c *net.UnixConn) *session {
	ctx, cancel := context.WithCancel(al.a.ctx)
	s := &session{al: al, conn: c, w: frame.Writer{Conn: c}, ctx: ctx, cancel: cancel, vconns: make(map[uint32]*vconnHandle), listeners: make(map[uint32]*listener)}
	s.log = al.a.log.WithValues("allocation", al.id)
	if cred, err := peerCred(c); err == nil {
		s.log = s.log.WithValues("pid", cred.Pid, "uid", cred.Uid, "gid", cred.Gid)
		// The network namespace ties the connection to its pod: the CNI
		// plugin's DEL names the pod's namespace.
		s.netns, _ = netnsInode(fmt.Sprintf("/proc/%d/ns/net", cred.Pid))
		s.log.Info("Application connected")
	} else {
		s.log.Error(err, "Application connected; its credentials are unknown")
	}
	return s
}

// run reads frames until the connection ends or one is malformed.
func (s *session) run() {
	defer s.close()
	buf := make([]byte, frame.MaxFrame+1)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.V(1).Info("Application connection ended", "reason", err.Error())
			}
			return
		}
		if n == 0 {
			return // the peer shut down
		}
		f, err := frame.Decode(buf[:n])
		if err == nil && n > frame.MaxFrame {
			err = frame.ErrTooBig
		}
		if err != nil {
			// A malformed frame means the client lost track of the
			// protocol: say why, then hang up.
			s.log.Info("Malformed frame: closing the connection", "reason", err.Error())
			_ = s.reply(reqOf(buf[:n]), 0, frame.CodeBadRequest, err.Error())
			return
		}
		if !s.dispatch(f) {
			return
		}
	}
}

// isRequest: op is one a client sends (docs/protocol.md §2's table).
func isRequest(op frame.Op) bool {
	return op >= frame.OpHello && op <= frame.OpRead || op == frame.OpShm || op == frame.OpStage
}

func reqOf(b []byte) uint32 {
	if len(b) < 8 {
		return 0
	}
	return uint32(b[4])<<24 | uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
}

// dispatch serves one request; false ends the session.
func (s *session) dispatch(f frame.Frame) bool {
	if !s.hello && f.Op != frame.OpHello {
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, "the first frame must be hello")
		return false
	}
	// An Error with req 0 and handle 0 is the session's last frame
	// (docs/protocol.md §3): the agent sends one only as it hangs up. So
	// a request whose answer would be one ends the session (R8.5, R8.6):
	// a request other than Grant with req 0 (its answer could not be told
	// from a push), and a Grant on handle 0 (its failure is pushed on the
	// handle it names, and no vconn has handle 0).
	switch {
	case f.Op == frame.OpGrant && f.Handle == 0:
		_ = s.reply(0, 0, frame.CodeBadRequest, "grant on handle 0: no vconn has handle 0")
		return false
	case f.Req == 0 && isRequest(f.Op) && f.Op != frame.OpGrant:
		_ = s.reply(0, 0, frame.CodeBadRequest, fmt.Sprintf("%v with req 0: a request's req must be nonzero (0 marks the agent's pushes)", f.Op))
		return false
	}
	switch f.Op {
	case frame.OpHello:
		if f.Arg < frame.MinVersion || f.Arg > frame.Version {
			_ = s.reply(f.Req, 0, frame.CodeVersion, fmt.Sprintf("protocol version %d not supported: this agent speaks %d to %d", f.Arg, frame.MinVersion, frame.Version))
			return false
		}
		s.hello = true
		info := frame.HelloInfo{Quota: uint32(s.al.quota), SendWindow: SendWindow, MaxMessage: s.maxMessage(), Node: s.al.a.cfg.NodeName}
		// The session speaks the client's version, which this agent does.
		return s.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: f.Arg, Arg2: uint64(features), Payload: frame.AppendHello(nil, info)}) == nil
	case frame.OpListen:
		// Async, as a dial: a pod's first Listen may wait for the agent
		// to learn the pod (allocation.scope).
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.listen(f)
		}()
	case frame.OpDial:
		s.wg.Add(1)
		host, bridged := string(f.Payload), f.Flags&frame.FlagBridge != 0
		go func() {
			defer s.wg.Done()
			s.dial(f.Req, host, bridged)
		}()
	case frame.OpClose:
		s.closeHandle(f)
	case frame.OpGrant:
		h := s.lookup(f.Handle)
		if h == nil {
			// Grant has no reply, and its req is not read: its failure
			// is a push on the handle it named (docs/protocol.md R8.9),
			// which a client that closed that vconn ignores.
			return s.reply(0, f.Handle, frame.CodeNoHandle, fmt.Sprintf("grant: no vconn %d in this session", f.Handle)) == nil
		}
		if s.shmOf(h.id) == nil { // a shared-memory vconn has no window
			h.grant(int(f.Arg))
		}
	case frame.OpShm:
		return s.openShm(f)
	case frame.OpSend, frame.OpExport, frame.OpUnexport, frame.OpLocalRead, frame.OpLocalWrite, frame.OpWrite, frame.OpRead, frame.OpStage:
		h := s.lookup(f.Handle)
		if h == nil {
			return s.reply(f.Req, f.Handle, frame.CodeNoHandle, fmt.Sprintf("%v: no such vconn", f.Op)) == nil
		}
		if f.Op == frame.OpSend && h.sendNow(f) {
			return true
		}
		// Past the window, past the allocation's limits.queuedBytes, or
		// on a vconn that ended: an error reply, the session goes on.
		o := op{f: f}
		o.f.Payload = append([]byte(nil), f.Payload...)
		if err := h.enqueue(o); err != nil {
			return s.replyErr(f.Req, f.Handle, err) == nil
		}
	default:
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, fmt.Sprintf("%v is not a request", f.Op))
		return false
	}
	return true
}

// features are what this agent offers beyond the protocol's first form,
// which Hello advertises.
const features = frame.FeatureMemfd | frame.FeatureStage

// maxMessage is the largest message of any vconn, which Hello advertises;
// each vconn's own, smaller on UC and UD, is in its VConnInfo.
func (s *session) maxMessage() uint32 {
	return uint32(min(frame.MaxPayload, s.al.a.eng.Config().MaxMessage))
}

// vconnInfo is what the application learns of a vconn when it opens: its
// transport and the largest message it carries, that of its transport
// (a UD datagram is one MTU less the engine's header) within the socket's.
func vconnInfo(vc *engine.VConn) frame.VConnInfo {
	return frame.VConnInfo{Transport: vc.Transport(), MaxMessage: uint32(min(frame.MaxPayload, vc.MaxMessage()))}
}

func (s *session) lookup(id uint32) *vconnHandle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vconns[id]
}

// close ends the session: every vconn closes, every listener goes.
func (s *session) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	hs := make([]*vconnHandle, 0, len(s.vconns))
	for _, h := range s.vconns {
		hs = append(hs, h)
	}
	ls := make([]*listener, 0, len(s.listeners))
	for _, l := range s.listeners {
		ls = append(ls, l)
	}
	s.mu.Unlock()
	// The socket first: the application sees its agent (or allocation) go
	// as one event, and a request racing the close cannot find its vconn
	// already gone and be answered "no such handle".
	s.cancel()
	_ = s.conn.Close()
	for _, l := range ls {
		s.unlisten(l)
	}
	for _, h := range hs {
		s.closeVConn(h)
	}
	s.wg.Wait()
	s.al.drop(s)
	s.log.V(1).Info("Application disconnected")
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/frame"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// SendWindow is how many operations (Send, Export, Write, Read...) of one
// vconn a client may have unanswered.
const SendWindow = 16

// dialTimeout bounds a Dial's control-plane work.
const dialTimeout = 10 * time.Second

// session is one application connection on an allocation's socket. Its
// handles name vconns and listeners of this connection only.
type session struct {
	al     *allocation
	conn   *net.UnixConn
	log    logr.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // dials, workers and pumps

	wmu  sync.Mutex // serialises writes; guards wbuf
	wbuf []byte

	mu        sync.Mutex
	next      uint32               // last handle; guarded by mu
	vconns    map[uint32]*handle   // guarded by mu
	listeners map[uint32]*listener // guarded by mu
	closed    bool                 // guarded by mu
	hello     bool                 // reader-owned
	netns     uint64               // the application's network namespace (inode), 0 if unknown
}

// listener is a port this node's vconns accept on.
type listener struct {
	sess   *session
	handle uint32
	port   uint32
}

// handle is a vconn of a session, with its worker (ordered operations)
// and pump (deliveries within the granted window).
type handle struct {
	s      *session
	id     uint32
	vc     *engine.VConn
	ctx    context.Context
	cancel context.CancelFunc
	ops    chan op // at most SendWindow queued

	gmu     sync.Mutex
	window  int           // granted, not yet pushed; guarded by gmu
	granted chan struct{} // signalled when window grows

	regions map[uint32]*engine.Region // worker-owned
}

type op struct {
	f frame.Frame // Payload owned by the op
}

func newSession(al *allocation, c *net.UnixConn) *session {
	ctx, cancel := context.WithCancel(al.a.ctx)
	s := &session{al: al, conn: c, ctx: ctx, cancel: cancel, vconns: make(map[uint32]*handle), listeners: make(map[uint32]*listener)}
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
		if !s.handle(f) {
			return
		}
	}
}

func reqOf(b []byte) uint32 {
	if len(b) < 8 {
		return 0
	}
	return uint32(b[4])<<24 | uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
}

// handle serves one request; false ends the session.
func (s *session) handle(f frame.Frame) bool {
	if !s.hello && f.Op != frame.OpHello {
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, "the first frame must be hello")
		return false
	}
	switch f.Op {
	case frame.OpHello:
		if f.Arg != frame.Version {
			_ = s.reply(f.Req, 0, frame.CodeVersion, fmt.Sprintf("protocol version %d not supported: this agent speaks %d", f.Arg, frame.Version))
			return false
		}
		s.hello = true
		info := frame.HelloInfo{Quota: uint32(s.al.quota), SendWindow: SendWindow, MaxMessage: s.maxMessage(), Node: s.al.a.cfg.NodeName}
		return s.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: frame.Version, Payload: frame.AppendHello(nil, info)}) == nil
	case frame.OpListen:
		s.listen(f)
	case frame.OpDial:
		s.wg.Add(1)
		host := string(f.Payload)
		go func() {
			defer s.wg.Done()
			s.dial(f.Req, host)
		}()
	case frame.OpClose:
		s.closeHandle(f)
	case frame.OpGrant:
		h := s.lookup(f.Handle)
		if h == nil {
			return s.reply(f.Req, f.Handle, frame.CodeNoHandle, "grant: no such vconn") == nil
		}
		h.grant(int(f.Arg))
	case frame.OpSend, frame.OpExport, frame.OpUnexport, frame.OpLocalRead, frame.OpLocalWrite, frame.OpWrite, frame.OpRead:
		h := s.lookup(f.Handle)
		if h == nil {
			return s.reply(f.Req, f.Handle, frame.CodeNoHandle, fmt.Sprintf("%v: no such vconn", f.Op)) == nil
		}
		f.Payload = append([]byte(nil), f.Payload...)
		select {
		case h.ops <- op{f: f}:
		default:
			return s.reply(f.Req, f.Handle, frame.CodeWindow, fmt.Sprintf("more than %d operations outstanding", SendWindow)) == nil
		}
	default:
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, fmt.Sprintf("%v is not a request", f.Op))
		return false
	}
	return true
}

func (s *session) maxMessage() uint32 {
	return uint32(min(frame.MaxPayload, s.al.a.eng.Config().MaxMessage))
}

func (s *session) write(f *frame.Frame) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var err error
	if s.wbuf, err = frame.Append(s.wbuf[:0], f); err != nil {
		return err
	}
	_, err = s.conn.Write(s.wbuf)
	return err
}

func (s *session) ok(req, h uint32) error {
	return s.write(&frame.Frame{Op: frame.OpOK, Req: req, Handle: h})
}

func (s *session) reply(req, h uint32, c frame.Code, msg string) error {
	return s.write(&frame.Frame{Op: frame.OpError, Req: req, Handle: h, Arg: uint32(c), Payload: []byte(msg)})
}

func (s *session) replyErr(req, h uint32, err error) error {
	return s.reply(req, h, codeOf(err), err.Error())
}

// codeOf classifies an error for the application.
func codeOf(err error) frame.Code {
	switch {
	case errors.Is(err, engine.ErrPeerGone), errors.Is(err, engine.ErrQPFailed):
		return frame.CodePeerGone
	case errors.Is(err, engine.ErrReset):
		return frame.CodeReset
	case errors.Is(err, engine.ErrClosed), errors.Is(err, engine.ErrNotOpen):
		return frame.CodeClosed
	case errors.Is(err, engine.ErrEngineClosed):
		return frame.CodeShuttingDown
	case errors.Is(err, engine.ErrTooLarge):
		return frame.CodeTooLarge
	case errors.Is(err, engine.ErrNoRegion), errors.Is(err, engine.ErrRegionAccess), errors.Is(err, verbs.ErrRemoteAccess):
		return frame.CodeRegion
	case errors.Is(err, verbs.ErrInvalid):
		return frame.CodeBadRequest
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.NotFound:
			return frame.CodeRefused
		case codes.ResourceExhausted:
			return frame.CodeQuota
		case codes.Unavailable, codes.DeadlineExceeded:
			return frame.CodeUnreachable
		case codes.InvalidArgument:
			return frame.CodeBadRequest
		}
	}
	return frame.CodeInternal
}

func (s *session) lookup(id uint32) *handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.vconns[id]
}

func (s *session) listen(f frame.Frame) {
	a := s.al.a
	if f.Arg == 0 || f.Arg > 65535 {
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, fmt.Sprintf("listen: port %d: want 1..65535", f.Arg))
		return
	}
	s.mu.Lock()
	s.next++
	l := &listener{sess: s, handle: s.next, port: f.Arg}
	s.mu.Unlock()
	a.mu.Lock()
	if a.listeners[l.port] != nil {
		a.mu.Unlock()
		_ = s.reply(f.Req, 0, frame.CodeAddrInUse, fmt.Sprintf("listen: port %d of %s already has a listener", l.port, a.cfg.NodeName))
		return
	}
	a.listeners[l.port] = l
	a.mu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.unlisten(l)
		return
	}
	s.listeners[l.handle] = l
	s.mu.Unlock()
	_ = s.ok(f.Req, l.handle)
}

func (s *session) unlisten(l *listener) {
	a := s.al.a
	a.mu.Lock()
	if a.listeners[l.port] == l {
		delete(a.listeners, l.port)
	}
	a.mu.Unlock()
}

// dial connects a vconn to host:port; host is a peer's node name or the
// host of its control address.
func (s *session) dial(req uint32, addr string) {
	a := s.al.a
	host, port, err := net.SplitHostPort(addr)
	p, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || p == 0 {
		_ = s.reply(req, 0, frame.CodeBadRequest, fmt.Sprintf("dial: address %q: want host:port", addr))
		return
	}
	var peer PeerInfo
	if bind, _ := a.bindAddr(); host == a.cfg.NodeName || bind.IsValid() && host == bind.String() {
		// Within the node, the agent is its own peer: its QPs loop back
		// on the device, as they would on a NIC, and the dial takes the
		// same control-plane path as any other.
		peer = PeerInfo{NodeName: a.cfg.NodeName, Address: a.ctlAddr}
	} else if peer, err = resolve(a.disc, host); err != nil {
		_ = s.reply(req, 0, frame.CodeUnreachable, fmt.Sprintf("dial %s: %v", addr, err))
		return
	}
	if !s.al.take() {
		_ = s.reply(req, 0, frame.CodeQuota, fmt.Sprintf("dial %s: allocation %s has all its %d vconns in use", addr, s.al.id, s.al.quota))
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	vc, err := a.dialPeer(ctx, peer, uint32(p))
	if err != nil {
		s.al.give()
		_ = s.reply(req, 0, codeOf(err), fmt.Sprintf("dial %s: %v", addr, err))
		return
	}
	h := s.add(vc)
	if h == nil {
		vc.Abort()
		s.al.give()
		return
	}
	if err := s.write(&frame.Frame{Op: frame.OpOK, Req: req, Handle: h.id, Payload: []byte(addr)}); err != nil {
		s.closeVConn(h)
	}
}

// accepted hands a vconn a peer dialled to listener l; false if the
// listener is gone.
func (s *session) accepted(l *listener, vc *engine.VConn, remote string) bool {
	s.mu.Lock()
	live := s.listeners[l.handle] == l
	s.mu.Unlock()
	if !live {
		return false
	}
	h := s.add(vc)
	if h == nil {
		return false
	}
	if err := s.write(&frame.Frame{Op: frame.OpAccept, Handle: l.handle, Arg: h.id, Payload: []byte(remote)}); err != nil {
		s.mu.Lock()
		delete(s.vconns, h.id)
		s.mu.Unlock()
		h.cancel()
		return false
	}
	return true
}

// add registers a vconn and starts its worker and pump; nil if the
// session closed.
func (s *session) add(vc *engine.VConn) *handle {
	ctx, cancel := context.WithCancel(s.ctx)
	h := &handle{s: s, vc: vc, ctx: ctx, cancel: cancel, ops: make(chan op, SendWindow), granted: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return nil
	}
	s.next++
	h.id = s.next
	s.vconns[h.id] = h
	s.wg.Add(2)
	s.mu.Unlock()
	go h.work()
	go h.pump()
	return h
}

func (s *session) closeHandle(f frame.Frame) {
	s.mu.Lock()
	h := s.vconns[f.Handle]
	l := s.listeners[f.Handle]
	delete(s.listeners, f.Handle)
	s.mu.Unlock()
	switch {
	case h != nil:
		s.closeVConn(h)
	case l != nil:
		s.unlisten(l)
	default:
		_ = s.reply(f.Req, f.Handle, frame.CodeNoHandle, "close: no such handle")
		return
	}
	_ = s.ok(f.Req, f.Handle)
}

// closeVConn closes a vconn (FIN after what the engine queued) and frees
// its quota slot. While the agent stops, the engine's close fails the
// vconn instead, silently.
func (s *session) closeVConn(h *handle) {
	s.mu.Lock()
	_, live := s.vconns[h.id]
	delete(s.vconns, h.id)
	s.mu.Unlock()
	if !live {
		return
	}
	h.cancel()
	if !s.al.a.stopping.Load() {
		_ = h.vc.Close()
	}
	s.al.give()
}

// close ends the session: every vconn closes, every listener goes.
func (s *session) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	hs := make([]*handle, 0, len(s.vconns))
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

func (h *handle) grant(n int) {
	if n <= 0 {
		return
	}
	h.gmu.Lock()
	h.window = min(h.window+n, 1<<20)
	h.gmu.Unlock()
	select {
	case h.granted <- struct{}{}:
	default:
	}
}

// pump delivers messages while the client has window: the agent reads
// from the engine only then, so an application that does not read holds
// its vconn's engine credits, not agent memory.
func (h *handle) pump() {
	defer h.s.wg.Done()
	s := h.s
	for {
		for {
			h.gmu.Lock()
			w := h.window
			h.gmu.Unlock()
			if w > 0 {
				break
			}
			select {
			case <-h.granted:
			case <-h.ctx.Done():
				return
			}
		}
		m, err := h.vc.Recv(h.ctx)
		if h.ctx.Err() != nil {
			if err == nil {
				m.Release()
			}
			return
		}
		switch {
		case errors.Is(err, io.EOF):
			_ = s.write(&frame.Frame{Op: frame.OpEOF, Handle: h.id})
			return
		case err != nil:
			_ = s.replyErr(0, h.id, err)
			return
		}
		f := frame.Frame{Op: frame.OpData, Handle: h.id, Payload: m.Data}
		if m.HasImm {
			f.Flags, f.Arg = frame.FlagImm, m.Imm
		}
		if len(m.Data) > frame.MaxPayload {
			_ = s.reply(0, h.id, frame.CodeTooLarge, fmt.Sprintf("received a message of %d bytes: the socket carries at most %d", len(m.Data), frame.MaxPayload))
			m.Release()
			h.vc.Abort()
			return
		}
		werr := s.write(&f)
		m.Release()
		if werr != nil {
			return
		}
		h.gmu.Lock()
		h.window--
		h.gmu.Unlock()
	}
}

// work runs the vconn's operations in order and answers each.
func (h *handle) work() {
	defer h.s.wg.Done()
	defer h.dropRegions()
	for {
		select {
		case <-h.ctx.Done():
			return
		case o := <-h.ops:
			if err := h.do(o.f); err != nil {
				if h.ctx.Err() != nil {
					return
				}
				_ = h.s.replyErr(o.f.Req, h.id, err)
			}
		}
	}
}

func (h *handle) do(f frame.Frame) error {
	s, vc := h.s, h.vc
	switch f.Op {
	case frame.OpSend:
		if uint32(len(f.Payload)) > s.maxMessage() {
			return fmt.Errorf("send %d bytes: %w (%d)", len(f.Payload), engine.ErrTooLarge, s.maxMessage())
		}
		var err error
		if f.Flags&frame.FlagImm != 0 {
			err = vc.SendImm(h.ctx, f.Payload, f.Arg)
		} else {
			err = vc.Send(h.ctx, f.Payload)
		}
		if err != nil {
			return err
		}
		return s.ok(f.Req, h.id)
	case frame.OpExport:
		if f.Arg2 == 0 || f.Arg2 > uint64(s.al.a.cfg.MaxMessageBytes) {
			return fmt.Errorf("export %d bytes: %w: want 1..%d", f.Arg2, verbs.ErrInvalid, s.al.a.cfg.MaxMessageBytes)
		}
		r, err := vc.Export(h.ctx, int(f.Arg2), engine.Access(f.Arg))
		if err != nil {
			return err
		}
		if h.regions == nil {
			h.regions = make(map[uint32]*engine.Region)
		}
		h.regions[r.ID()] = r
		return s.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Arg: r.ID()})
	case frame.OpUnexport:
		r := h.regions[f.Arg]
		if r == nil {
			return fmt.Errorf("unexport region %d: %w", f.Arg, engine.ErrNoRegion)
		}
		delete(h.regions, f.Arg)
		if err := r.Close(); err != nil {
			return err
		}
		return s.ok(f.Req, h.id)
	case frame.OpLocalRead, frame.OpLocalWrite:
		r := h.regions[f.Arg]
		if r == nil {
			return fmt.Errorf("%v region %d: %w", f.Op, f.Arg, engine.ErrNoRegion)
		}
		b := r.Bytes()
		n := uint64(len(f.Payload))
		if f.Op == frame.OpLocalRead {
			l, err := frame.DecodeLength(f.Payload)
			if err != nil {
				return fmt.Errorf("%w: %w", verbs.ErrInvalid, err)
			}
			n = uint64(l)
		}
		if f.Arg2 > uint64(len(b)) || n > uint64(len(b))-f.Arg2 {
			return fmt.Errorf("%v: %d bytes at %d outside region %d of %d: %w", f.Op, n, f.Arg2, f.Arg, len(b), engine.ErrRegionAccess)
		}
		if f.Op == frame.OpLocalWrite {
			copy(b[f.Arg2:], f.Payload)
			return s.ok(f.Req, h.id)
		}
		return s.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Payload: b[f.Arg2 : f.Arg2+n]})
	case frame.OpWrite:
		if err := vc.Write(h.ctx, f.Arg, f.Arg2, f.Payload); err != nil {
			return err
		}
		return s.ok(f.Req, h.id)
	case frame.OpRead:
		l, err := frame.DecodeLength(f.Payload)
		if err != nil {
			return fmt.Errorf("%w: %w", verbs.ErrInvalid, err)
		}
		buf := make([]byte, l)
		if err := vc.Read(h.ctx, f.Arg, f.Arg2, buf); err != nil {
			return err
		}
		return s.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: h.id, Payload: buf})
	}
	return fmt.Errorf("%v: %w", f.Op, verbs.ErrInvalid)
}

func (h *handle) dropRegions() {
	for id, r := range h.regions {
		_ = r.Close()
		delete(h.regions, id)
	}
}

package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// dialTimeout bounds a Dial's control-plane work.
const dialTimeout = 10 * time.Second

// listener is a port this node's vconns accept on, in one port space:
// its allocation's pod's, or the node's host services'.
type listener struct {
	sess    *session
	id      uint32 // its handle in the session
	key     portKey
	bridged bool // frame.FlagBridge: each vconn accepted is handed over as a socket
	// accepted counts the vconns open of those the listener accepted, by
	// caller (acceptKept, accept.go); guarded by sess.al.mu.
	accepted map[string]int
}

// listen binds a port of the allocation's own port space: its pod's, or
// the node's for host services. A port taken is reported only within that
// space, so no pod learns another's ports.
func (s *session) listen(f frame.Frame) {
	a := s.al.a
	if f.Arg == 0 || f.Arg > 65535 {
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, fmt.Sprintf("listen: port %d: want 1..65535", f.Arg))
		return
	}
	if f.Flags&frame.FlagBridge != 0 {
		if err := s.bridgeable(); err != nil {
			_ = s.replyErr(f.Req, 0, fmt.Errorf("listen on port %d: %w", f.Arg, err))
			return
		}
	}
	scope, ips, err := s.al.scope(s.ctx)
	if err != nil {
		_ = s.replyErr(f.Req, 0, fmt.Errorf("listen on port %d: %w", f.Arg, err))
		return
	}
	if err := s.al.claimListener(); err != nil {
		_ = s.reply(f.Req, 0, frame.CodeLimit, err.Error())
		return
	}
	s.mu.Lock()
	s.next++
	l := &listener{sess: s, id: s.next, key: portKey{scope: scope, port: f.Arg}, bridged: f.Flags&frame.FlagBridge != 0}
	s.mu.Unlock()
	a.mu.Lock()
	if a.listeners[l.key] != nil {
		a.mu.Unlock()
		s.al.releaseListener()
		_ = s.reply(f.Req, 0, frame.CodeAddrInUse, fmt.Sprintf("listen: %s already has a listener", boundAddr(a.cfg.NodeName, ips, f.Arg)))
		return
	}
	a.listeners[l.key] = l
	a.mu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.unlisten(l)
		return
	}
	s.listeners[l.id] = l
	s.mu.Unlock()
	_ = s.write(&frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: l.id, Payload: []byte(boundAddr(a.cfg.NodeName, ips, f.Arg))})
}

// bridgeable says whether the allocation's vconns can be bridged: a byte
// stream cannot ride a transport that may lose messages (uc, ud), and a
// vconn takes its engine's transport. A bridged Dial or Listen is refused
// so (errUnreliable: CodeBadRequest) before anything reaches a listener.
func (s *session) bridgeable() error {
	eng, err := s.al.a.engineOf(s.al.rail)
	if err != nil {
		return err
	}
	if tr := eng.Config().Transport; !tr.Reliable() {
		return fmt.Errorf("bridge: this node's vconns are %v, which cannot carry a stream (rc or auto can): %w", tr, errUnreliable)
	}
	return nil
}

// boundAddr is a listener's address as its application sees it: the
// pod's first IP (IPv4 first), or the node's name for host services.
func boundAddr(node string, ips []netip.Addr, port uint32) string {
	host := node
	if len(ips) > 0 {
		host = ips[0].String()
	}
	for _, ip := range ips {
		if ip.Is4() {
			host = ip.String()
			break
		}
	}
	return net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
}

func (s *session) unlisten(l *listener) {
	a := s.al.a
	a.mu.Lock()
	mine := a.listeners[l.key] == l
	if mine {
		delete(a.listeners, l.key)
	}
	a.mu.Unlock()
	if mine {
		s.al.releaseListener()
	}
}

// dial connects a vconn to host:port: a pod IP (of this node or one a
// peer announced), a node's address or name (its host services). The
// allocation dials as its pod: the listener sees the pod's IP. A bridged
// dial hands the vconn over as a socket (bridge.go) in the OK reply.
func (s *session) dial(req uint32, addr string, bridged bool) {
	a := s.al.a
	host, port, err := parseDialAddr(addr)
	if err != nil {
		_ = s.reply(req, 0, frame.CodeBadRequest, fmt.Sprintf("dial: %v", err))
		return
	}
	if bridged {
		// Refused before anything is dialled: no listener hears of a
		// vconn that could not be handed over.
		if err := s.bridgeable(); err != nil {
			_ = s.replyErr(req, 0, fmt.Errorf("dial %s: %w", addr, err))
			return
		}
	}
	_, from, err := s.al.scope(s.ctx)
	if err != nil {
		_ = s.replyErr(req, 0, fmt.Errorf("dial %s: %w", addr, err))
		return
	}
	t, err := a.route(s.ctx, host)
	if err != nil {
		_ = s.replyErr(req, 0, fmt.Errorf("dial %s: %w", addr, err))
		return
	}
	var fromIP netip.Addr
	if len(from) > 0 {
		fromIP = from[0]
	}
	if err := a.checkEgress(s.al, fromIP, t, port); err != nil {
		_ = s.replyErr(req, 0, fmt.Errorf("dial %s: %w", addr, err))
		return
	}
	if !s.al.take() {
		_ = s.reply(req, 0, frame.CodeQuota, fmt.Sprintf("dial %s: allocation %s has all its %d vconns in use", addr, s.al.id, s.al.quota))
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	vc, err := a.dialPeer(ctx, t, fromIP, port, s.al.rail)
	if err != nil {
		s.al.give()
		_ = s.reply(req, 0, codeOf(err), fmt.Sprintf("dial %s: %v", addr, err))
		return
	}
	if bridged {
		prog, err := s.al.newBridge(vc)
		if err != nil {
			vc.Abort()
			s.al.give()
			_ = s.replyErr(req, 0, fmt.Errorf("dial %s: %w", addr, err))
			return
		}
		// If the reply is lost, so is the program's end: the bridge
		// sees it closed and ends.
		_ = s.writeRights(&frame.Frame{Op: frame.OpOK, Req: req, Arg2: vconnInfo(vc).Arg2(), Payload: []byte(addr)}, []int{int(prog.Fd())})
		_ = prog.Close()
		return
	}
	h := s.add(vc)
	if h == nil {
		vc.Abort()
		s.al.give()
		return
	}
	if err := s.write(&frame.Frame{Op: frame.OpOK, Req: req, Handle: h.id, Arg2: h.info.Arg2(), Payload: []byte(addr)}); err != nil {
		s.closeVConn(h)
	}
}

// accepted hands a vconn a peer dialled to listener l; false if the
// listener is gone. The vconn holds slot (takeAccept), which its end
// gives back.
func (s *session) accepted(l *listener, vc *engine.VConn, remote string, slot acceptSlot) bool {
	s.mu.Lock()
	live := s.listeners[l.id] == l
	s.mu.Unlock()
	if !live {
		return false
	}
	if l.bridged {
		prog, err := s.al.newBridgeFor(vc, slot)
		if err != nil {
			s.log.Error(err, "Cannot bridge an accepted vconn", "port", l.key.port)
			return false
		}
		_ = s.writeRights(&frame.Frame{Op: frame.OpAccept, Handle: l.id, Arg2: vconnInfo(vc).Arg2(), Payload: []byte(remote)}, []int{int(prog.Fd())})
		_ = prog.Close()
		return true
	}
	h := s.addFor(vc, slot)
	if h == nil {
		return false
	}
	if err := s.write(&frame.Frame{Op: frame.OpAccept, Handle: l.id, Arg: h.id, Arg2: h.info.Arg2(), Payload: []byte(remote)}); err != nil {
		s.mu.Lock()
		delete(s.vconns, h.id)
		s.mu.Unlock()
		h.cancel()
		return false
	}
	return true
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

package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/discovery"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// dialTimeout bounds a Dial's control-plane work.
const dialTimeout = 10 * time.Second

// listener is a port this node's vconns accept on.
type listener struct {
	sess *session
	id   uint32 // its handle in the session
	port uint32
}

func (s *session) listen(f frame.Frame) {
	a := s.al.a
	if f.Arg == 0 || f.Arg > 65535 {
		_ = s.reply(f.Req, 0, frame.CodeBadRequest, fmt.Sprintf("listen: port %d: want 1..65535", f.Arg))
		return
	}
	if err := s.al.claimListener(); err != nil {
		_ = s.reply(f.Req, 0, frame.CodeLimit, err.Error())
		return
	}
	s.mu.Lock()
	s.next++
	l := &listener{sess: s, id: s.next, port: f.Arg}
	s.mu.Unlock()
	a.mu.Lock()
	if a.listeners[l.port] != nil {
		a.mu.Unlock()
		s.al.releaseListener()
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
	s.listeners[l.id] = l
	s.mu.Unlock()
	_ = s.ok(f.Req, l.id)
}

func (s *session) unlisten(l *listener) {
	a := s.al.a
	a.mu.Lock()
	mine := a.listeners[l.port] == l
	if mine {
		delete(a.listeners, l.port)
	}
	a.mu.Unlock()
	if mine {
		s.al.releaseListener()
	}
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
	var peer discovery.Peer
	if bind, _ := a.bindAddr(); host == a.cfg.NodeName || bind.IsValid() && host == bind.String() {
		// Within the node, the agent is its own peer: its QPs loop back
		// on the device, as they would on a NIC, and the dial takes the
		// same control-plane path as any other.
		peer = discovery.Peer{NodeName: a.cfg.NodeName, Address: a.ctlAddr}
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
	if err := s.write(&frame.Frame{Op: frame.OpOK, Req: req, Handle: h.id, Arg2: h.info.Arg2(), Payload: []byte(addr)}); err != nil {
		s.closeVConn(h)
	}
}

// accepted hands a vconn a peer dialled to listener l; false if the
// listener is gone.
func (s *session) accepted(l *listener, vc *engine.VConn, remote string) bool {
	s.mu.Lock()
	live := s.listeners[l.id] == l
	s.mu.Unlock()
	if !live {
		return false
	}
	h := s.add(vc)
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

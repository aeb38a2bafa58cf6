package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/engine"
)

// errUnreliable: a bridge asked of a vconn whose transport may lose
// messages (frame.CodeBadRequest).
var errUnreliable = errors.New("unreliable transport")

// bridge carries a vconn as a byte stream over one end of a socketpair
// whose other end a program holds as if it were a TCP socket (Dial or
// Listen with frame.FlagBridge: the preload library's connect and
// accept). The program's socket is a real kernel socket, so poll, epoll,
// fork, dup and non-blocking I/O behave as they do on TCP; the agent
// copies between it and the engine.
//
// A bridge outlives the session that made it (the program keeps the
// socket, not the session): it holds a vconn of the allocation's quota
// until both directions end, and goes with the allocation.
type bridge struct {
	al     *allocation
	vc     *engine.VConn
	slot   acceptSlot    // its place in the quota (accept.go)
	c      *net.UnixConn // the agent's end
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// newBridge makes the socketpair of a vconn the allocation holds (take
// was called), registers the bridge with its allocation and starts its
// copies. It returns the program's end, to be passed by SCM_RIGHTS and
// then closed; from then on the bridge owns the vconn and its place in the
// quota. On error the caller still owns both.
func (al *allocation) newBridge(vc *engine.VConn) (*os.File, error) {
	return al.newBridgeFor(vc, acceptSlot{})
}

// newBridgeFor is newBridge for a vconn that holds slot: a listener's
// (takeAccept), or the zero slot of one dialled.
func (al *allocation) newBridgeFor(vc *engine.VConn, slot acceptSlot) (*os.File, error) {
	if !vc.Transport().Reliable() {
		// A byte stream cannot lose a message: only rc and auto carry one.
		return nil, fmt.Errorf("bridge: a %v vconn cannot carry a stream (rc or auto can): %w", vc.Transport(), errUnreliable)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("bridge: socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "bridge")
	prog := os.NewFile(uintptr(fds[1]), "bridge-program")
	fc, err := net.FileConn(mine)
	_ = mine.Close() // FileConn holds its own descriptor
	if err != nil {
		_ = prog.Close()
		return nil, fmt.Errorf("bridge: %w", err)
	}
	ctx, cancel := context.WithCancel(al.a.ctx)
	b := &bridge{al: al, vc: vc, slot: slot, c: fc.(*net.UnixConn), ctx: ctx, cancel: cancel}
	al.mu.Lock()
	if al.closed {
		al.mu.Unlock()
		cancel()
		_ = b.c.Close()
		_ = prog.Close()
		return nil, fmt.Errorf("bridge: allocation %s: %w", al.id, engine.ErrClosed)
	}
	if al.bridges == nil {
		al.bridges = make(map[*bridge]struct{})
	}
	al.bridges[b] = struct{}{}
	al.mu.Unlock()
	b.wg.Add(2)
	go b.up()
	go b.down()
	go b.reap()
	return prog, nil
}

// up sends what the program writes, a read at a time: the bridge's
// sending goroutine, with the socket as its source. Each read goes
// straight into the engine's send buffer (engine.VConn.SendFrom), a
// message of one chunk at most, so that the bytes are copied twice on the
// way from the program to the wire (its write into the socket, the read
// out of it) and twice on the way back (the peer's receive buffer into
// the socket, the program's read), with no reassembly at the receiver.
func (b *bridge) up() {
	defer b.wg.Done()
	t := &bridgeTX{b: b, size: engine.FillSmall}
	rc, err := b.c.SyscallConn()
	if err != nil {
		t.end(err)
		return
	}
	t.rc = rc
	t.sendFn, t.onceFn, t.readFn = t.send, t.sendOnce, t.read
	forward(b.ctx, b.vc, t)
}

// bridgeTX is the program's socket as a source: each read is a message
// that the engine's SendFrom reads into its buffer (outgoing.send). The
// socket is non-blocking: a read that finds nothing gives the buffer back
// and waits for the socket in Go's poller, so that no send buffer is held
// while the program writes nothing.
type bridgeTX struct {
	b  *bridge
	rc syscall.RawConn
	// size is what the next read may fill: a small buffer after a short
	// read (requests), a chunk after a full one (a stream).
	size int

	// The callbacks and their arguments, made once: a closure a message
	// would allocate.
	sendFn func() (int, error)
	onceFn func(fd uintptr) bool
	readFn func([]byte) (int, error)
	fd     int
	n      int
	err    error
}

func (t *bridgeTX) next() (outgoing, error) { return outgoing{send: t.sendFn}, nil }

// send sends the next read of the socket on the bridge's vconn, waiting
// until there is one.
func (t *bridgeTX) send() (int, error) {
	t.n, t.err = 0, nil
	if err := t.rc.Read(t.onceFn); err != nil {
		return 0, err // the socket closed: the bridge ends
	}
	return t.n, t.err
}

// sendOnce sends one read of the socket (fd); false, to wait until it is
// readable, when there was nothing to read.
func (t *bridgeTX) sendOnce(fd uintptr) bool {
	t.fd = int(fd)
	t.n, t.err = t.b.vc.SendFrom(t.b.ctx, t.size, t.readFn)
	switch {
	case errors.Is(t.err, errWouldBlock):
		t.size = engine.FillSmall
		return false
	case t.n == t.size:
		t.size = t.b.vc.FillSize()
	case t.n > 0:
		t.size = engine.FillSmall
	}
	return true
}

// errWouldBlock: a non-blocking read found nothing.
var errWouldBlock = errors.New("nothing to read")

// read reads the socket once, without waiting: errWouldBlock when there
// is nothing, io.EOF at the program's end.
func (t *bridgeTX) read(b []byte) (int, error) {
	for {
		n, err := unix.Read(t.fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF // a stream read of 0 bytes is its end
		}
		return n, nil
	}
}

// sent: a failed send (the vconn failed, or the agent stops) resets the
// program's socket.
func (t *bridgeTX) sent(err error) bool {
	if err != nil {
		t.b.cancel()
		return false
	}
	return true
}

// end: the program's close, or its shutdown(SHUT_WR), is the end of what
// it sends; then the peer reads EOF and may still answer, until the
// close. Any other error resets the socket.
func (t *bridgeTX) end(err error) {
	b := t.b
	if !errors.Is(err, io.EOF) {
		b.cancel()
		return
	}
	if !b.hungUp() {
		_ = b.vc.CloseWrite()
		if !b.waitClosed() {
			return
		}
	}
	_ = b.vc.Close()
}

// hungUp: no process holds the program's end any more (POLLHUP: it was
// closed, not only shut down for writing).
func (b *bridge) hungUp() bool {
	rc, err := b.c.SyscallConn()
	if err != nil {
		return true
	}
	hup := false
	_ = rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil && n > 0 {
			hup = p[0].Revents&unix.POLLHUP != 0
		}
	})
	return hup
}

// waitClosed waits, after the program's shutdown(SHUT_WR), until it
// closes the socket, or the bridge ends; true if the program closed it.
// Half-closed sockets are rare and the vconn still delivers meanwhile: a
// slow check costs nothing on the data path.
func (b *bridge) waitClosed() bool {
	for b.ctx.Err() == nil {
		if b.hungUp() {
			return true
		}
		select {
		case <-b.ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}

// down delivers the vconn's messages to the program (bridgeRX).
func (b *bridge) down() {
	defer b.wg.Done()
	deliver(b.ctx, b.vc, b.al, bridgeRX{b})
}

// bridgeRX is the bridge's carrier: the bytes of each message, in order,
// on the stream socket, whose buffer is the window (a program that does
// not read holds the vconn's credits).
type bridgeRX struct{ b *bridge }

func (c bridgeRX) ready() bool { return c.b.ctx.Err() == nil }

func (c bridgeRX) put(m engine.Message) bool {
	if _, err := c.b.c.Write(m.Data); err != nil {
		// The program closed its socket: nothing more reaches it.
		c.b.vc.Abort()
		c.b.cancel()
		return false
	}
	return true
}

// end: the peer's close is the program's end of file (a shutdown of the
// agent's writing side); a failed vconn resets the program's socket (the
// bridge closes it).
func (c bridgeRX) end(err error) {
	if errors.Is(err, io.EOF) {
		_ = c.b.c.CloseWrite()
		return
	}
	c.b.cancel()
}

func (bridgeRX) limit() (int, string) { return math.MaxInt, "the bridge" }

// reap ends the bridge once both copies returned, or at once when it is
// cancelled (the vconn failed, the program went, the allocation or the
// agent stops): the socket closes, the vconn goes back to the quota.
func (b *bridge) reap() {
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-b.ctx.Done():
	}
	b.cancel()
	_ = b.c.Close() // unblocks a copy waiting on the socket
	<-done
	if !b.al.a.stopping.Load() {
		_ = b.vc.Close() // FIN after what was sent; nothing when it failed or was aborted
	}
	b.al.mu.Lock()
	delete(b.al.bridges, b)
	b.al.mu.Unlock()
	b.al.giveFor(b.slot)
}

// closeBridges ends an allocation's bridges (it is going).
func (al *allocation) closeBridges() {
	al.mu.Lock()
	bs := make([]*bridge, 0, len(al.bridges))
	for b := range al.bridges {
		bs = append(bs, b)
	}
	al.mu.Unlock()
	for _, b := range bs {
		b.vc.Abort()
		b.cancel()
	}
}

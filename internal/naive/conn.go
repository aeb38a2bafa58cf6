package naive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Conn states.
const (
	stateOpen uint32 = iota
	stateFailed
	stateClosed // Close was called; the poller destroys the resources
)

// imm_data layout: the top bit marks a credit message, the rest is the
// sender's cumulative count of receive buffers it has reposted for data
// (mod 2^31): its credit grant.
const (
	immCtl    = 1 << 31
	immCredit = immCtl - 1
)

// wr_id layout of send WRs: the top bit marks a credit message, then the
// WR's sequence number (39 bits), then the data messages posted up to and
// including it (mod 2^24). A completion frees every WR up to its own.
const (
	wridCtl      = 1 << 63
	wridDataBits = 24
	wridDataMask = 1<<wridDataBits - 1
)

// Handler receives a connection's messages on a poller goroutine. It must
// not block, and must Release every message, soon: an unreleased message
// holds one of the sender's credits.
type Handler func(c *Conn, m Message)

// ConnOptions configure one end of a connection.
type ConnOptions struct {
	// Handler, if set, gets every message; otherwise messages queue for
	// Recv.
	Handler Handler
}

// Message is one received message. Data lies in the connection's receive
// buffer and is valid until Release or the connection's Close, whichever
// comes first.
type Message struct {
	Data []byte
	c    *Conn
	slot uint32
}

// Release gives the buffer back: the poller reposts it and returns the
// credit to the sender. Release a message once.
func (m Message) Release() {
	c := m.c
	if c == nil {
		return
	}
	c.relMu.Lock()
	c.released = append(c.released, m.slot)
	c.relMu.Unlock()
	c.nreleased.Add(1)
}

// Conn is one end of a naive connection: an RC QP with its own CQ and
// registered buffers.
//
// Send side: the sender (whoever holds sendMu) posts directly on the QP.
// The poller reads completions and credits and publishes them in the
// atomics; a blocked sender waits on wake.
type Conn struct {
	e       *Endpoint
	p       *poller
	cq      verbs.CQ
	qp      verbs.QP
	mr      verbs.MR
	buf     []byte // the region: receive slots, then send slots
	handler Handler
	state   atomic.Uint32

	sendMu     sync.Mutex
	wr         [1]verbs.SendWR // guarded by sendMu
	inl        []byte          // inline staging, MaxInline bytes; guarded by sendMu
	wrPosted   uint64          // guarded by sendMu
	dataPosted uint64          // guarded by sendMu
	sqDepth    uint64

	wrDone    atomic.Uint64 // WRs completed (set by the poller)
	dataDone  atomic.Uint64 // data messages completed (set by the poller)
	limit     atomic.Uint64 // data messages the peer's credits allow, cumulative
	waiters   atomic.Int32
	wake      chan struct{}
	reposted  atomic.Uint32 // data buffers reposted, cumulative: our grant
	granted   atomic.Uint32 // the reposted count last sent in an imm_data
	peerGrant uint32        // poller-owned: last grant the peer sent
	ctlBusy   bool          // poller-owned: a credit message is outstanding

	relMu     sync.Mutex
	released  []uint32 // receive slots to repost; guarded by relMu
	nreleased atomic.Int32

	counted bool // its region counts in the endpoint's Stats

	rxMu   sync.Mutex
	rxq    []Message     // guarded by rxMu
	rxWake chan struct{} // guarded by rxMu
	err    error         // guarded by rxMu: why the conn failed
}

func (c *Conn) recvSlots() int { return c.e.cfg.RecvDepth + ctlBuffers }

func (c *Conn) slotBytes(slot int) []byte {
	n := c.e.cfg.MaxMessage
	return c.buf[slot*n : (slot+1)*n]
}

func (c *Conn) sge(slot int, n int) verbs.SGE {
	return verbs.SGE{Addr: c.mr.Addr() + uint64(slot*c.e.cfg.MaxMessage), Length: uint32(n), LKey: c.mr.LKey()}
}

// newConn creates a connection's QP (in RESET), CQ and region.
func (e *Endpoint) newConn(o ConnOptions) (_ *Conn, err error) {
	if e.closed.Load() {
		return nil, ErrEndpointClosed
	}
	cfg := e.cfg
	c := &Conn{e: e, handler: o.Handler, wake: make(chan struct{}, 1), sqDepth: uint64(cfg.SendDepth + 1)}
	c.limit.Store(uint64(cfg.RecvDepth))
	defer func() {
		if err != nil {
			err = errors.Join(err, c.destroy())
		}
	}()
	slots := c.recvSlots() + cfg.SendDepth
	if c.cq, err = e.dev.CreateCQ(c.recvSlots() + int(c.sqDepth)); err != nil {
		return nil, fmt.Errorf("naive: new conn: %w", err)
	}
	c.qp, err = e.pd.CreateQP(&verbs.QPInitAttr{
		Type: verbs.QPTypeRC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: verbs.QPCap{MaxSendWR: uint32(c.sqDepth), MaxRecvWR: uint32(c.recvSlots()), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(cfg.MaxInline)},
	})
	if err != nil {
		return nil, fmt.Errorf("naive: new conn: %w", err)
	}
	if c.mr, err = e.pd.RegMR(slots*cfg.MaxMessage, verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("naive: new conn: %w", err)
	}
	c.buf = c.mr.Bytes()
	if cfg.MaxInline > 0 {
		c.inl = make([]byte, cfg.MaxInline)
	}
	c.counted = true
	e.registered.Add(int64(len(c.buf)))
	e.live.Add(1)
	return c, nil
}

// postRecvs posts every receive buffer; the QP is past RESET.
func (c *Conn) postRecvs() error {
	wrs := make([]verbs.RecvWR, c.recvSlots())
	for i := range wrs {
		wrs[i] = verbs.RecvWR{WRID: uint64(i), NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{c.sge(i, c.e.cfg.MaxMessage)}}
	}
	_, err := c.qp.PostRecv(wrs)
	return err
}

// destroy frees the conn's verbs objects; nothing may use them any more.
func (c *Conn) destroy() error {
	var errs []error
	if c.qp != nil {
		errs = append(errs, c.qp.Close())
	}
	if c.cq != nil {
		errs = append(errs, c.cq.Close())
	}
	if c.mr != nil {
		errs = append(errs, c.mr.Close())
	}
	// Messages that will never complete give their window back.
	c.e.release(c.dataPosted - c.dataDone.Load())
	if c.counted {
		c.e.registered.Add(-int64(len(c.buf)))
		c.e.live.Add(-1)
	}
	return errors.Join(errs...)
}

// pathOptions are the engine's path settings, so the comparison is of the
// designs, not of timers: with the verbs default (67 ms × 7 retries) a
// descheduled poller among thousands of QPs fails connections the engine's
// 268 ms timeout would keep.
func (e *Endpoint) pathOptions(mtu verbs.MTU, psn uint32) verbs.PathOptions {
	return verbs.PathOptions{MTU: mtu, SQPSN: psn, Timeout: 16, RetryCnt: 7, RNRRetry: 7}
}

// Pair connects a new conn on a to a new conn on b, both endpoints in this
// process: the QP numbers and PSNs an application would exchange over its
// own control channel are exchanged directly.
func Pair(ctx context.Context, a, b *Endpoint, oa, ob ConnOptions) (_, _ *Conn, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	ca, err := a.newConn(oa)
	if err != nil {
		return nil, nil, err
	}
	cb, err := b.newConn(ob)
	if err != nil {
		return nil, nil, errors.Join(err, ca.destroy())
	}
	adopted := false
	defer func() {
		if err != nil && !adopted {
			err = errors.Join(err, ca.destroy(), cb.destroy())
		}
	}()
	mtu := min(a.cfg.MTU, b.cfg.MTU)
	psnA, psnB := rand.Uint32()&(1<<24-1), rand.Uint32()&(1<<24-1)
	if err := verbs.ConnectQP(ca.qp, verbs.Remote{GID: b.gid, QPN: cb.qp.QPN(), PSN: psnB}, a.pathOptions(mtu, psnA)); err != nil {
		return nil, nil, fmt.Errorf("naive: pair: %w", err)
	}
	if err := verbs.ConnectQP(cb.qp, verbs.Remote{GID: a.gid, QPN: ca.qp.QPN(), PSN: psnA}, b.pathOptions(mtu, psnB)); err != nil {
		return nil, nil, fmt.Errorf("naive: pair: %w", err)
	}
	if err := errors.Join(ca.postRecvs(), cb.postRecvs()); err != nil {
		return nil, nil, fmt.Errorf("naive: pair: post receives: %w", err)
	}
	// Once a poller has a conn, the poller destroys it.
	if err := a.adopt(ca); err != nil {
		return nil, nil, err
	}
	adopted = true
	if err := b.adopt(cb); err != nil {
		_ = ca.Close()
		return nil, nil, errors.Join(err, cb.destroy())
	}
	return ca, cb, nil
}

// adopt hands c to one of the endpoint's pollers.
func (e *Endpoint) adopt(c *Conn) error {
	p := e.pollers[int(e.next.Add(1))%len(e.pollers)]
	c.p = p
	if !p.add(c) {
		return ErrEndpointClosed
	}
	return nil
}

// Send sends one message, blocking while the connection has no credit or
// no free send buffer.
func (c *Conn) Send(ctx context.Context, data []byte) error {
	_, err := c.send(ctx, data, true)
	return err
}

// TrySend sends one message if a credit and a send buffer are free now; it
// reports false, without error, when they are not.
func (c *Conn) TrySend(data []byte) (bool, error) {
	return c.send(context.Background(), data, false)
}

func (c *Conn) canSend() bool {
	return c.dataPosted-c.dataDone.Load() < uint64(c.e.cfg.SendDepth) &&
		c.wrPosted-c.wrDone.Load() < c.sqDepth-1 && // one WR stays free for a credit message
		c.dataPosted < c.limit.Load()
}

func (c *Conn) send(ctx context.Context, data []byte, block bool) (bool, error) {
	cfg := &c.e.cfg
	if len(data) > cfg.MaxMessage {
		return false, fmt.Errorf("naive: send %d bytes: %w (%d)", len(data), ErrTooLarge, cfg.MaxMessage)
	}
	if ok, err := c.e.acquire(ctx, block); !ok {
		return false, err
	}
	if block {
		c.sendMu.Lock()
	} else if !c.sendMu.TryLock() {
		c.e.release(1)
		return false, nil
	}
	for {
		if err := c.sendErr(); err != nil {
			c.sendMu.Unlock()
			c.e.release(1)
			c.passWake()
			return false, err
		}
		if c.canSend() {
			break
		}
		if !block {
			c.sendMu.Unlock()
			c.e.release(1)
			return false, nil
		}
		c.waiters.Add(1)
		if c.canSend() || c.state.Load() != stateOpen {
			c.waiters.Add(-1)
			continue
		}
		c.sendMu.Unlock()
		select {
		case <-c.wake:
		case <-ctx.Done():
			c.waiters.Add(-1)
			c.e.release(1)
			return false, ctx.Err()
		}
		c.waiters.Add(-1)
		c.sendMu.Lock()
	}
	err := c.postData(data)
	c.sendMu.Unlock()
	if err != nil {
		c.fail(err)
		return false, err
	}
	c.passWake()
	return true, nil
}

// passWake hands the wake-up on to another blocked sender if there is room
// for it.
func (c *Conn) passWake() {
	if c.waiters.Load() > 0 {
		c.wakeSenders()
	}
}

func (c *Conn) wakeSenders() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Conn) sendErr() error {
	switch c.state.Load() {
	case stateOpen:
		return nil
	case stateFailed:
		c.rxMu.Lock()
		defer c.rxMu.Unlock()
		return c.err
	}
	return ErrClosed
}

// postData posts one data message; sendMu is held and canSend was true.
func (c *Conn) postData(data []byte) error {
	cfg := &c.e.cfg
	wr := &c.wr[0]
	*wr = verbs.SendWR{Opcode: verbs.WRSendWithImm}
	if len(data) > 0 {
		wr.NumSGE = 1
		if len(data) <= cfg.MaxInline {
			n := copy(c.inl, data)
			wr.Flags |= verbs.SendInline
			wr.SG[0] = verbs.SGE{Addr: verbs.AddrOf(c.inl), Length: uint32(n)}
		} else {
			slot := c.recvSlots() + int(c.dataPosted%uint64(cfg.SendDepth))
			n := copy(c.slotBytes(slot), data)
			wr.SG[0] = c.sge(slot, n)
		}
	}
	c.dataPosted++
	return c.post(wr, false)
}

// post stamps the credit grant and the wr_id, posts, and counts.
func (c *Conn) post(wr *verbs.SendWR, ctl bool) error {
	grant := c.reposted.Load()
	wr.ImmData = grant & immCredit
	wr.WRID = c.wrPosted<<wridDataBits | c.dataPosted&wridDataMask
	if ctl {
		wr.ImmData |= immCtl
		wr.WRID |= wridCtl
		wr.Flags |= verbs.SendSignaled
	} else if (c.wrPosted+1)%uint64(c.e.cfg.SignalEvery) == 0 {
		wr.Flags |= verbs.SendSignaled
	}
	if _, err := c.qp.PostSend(c.wr[:]); err != nil {
		return fmt.Errorf("naive: post send on QP %#x: %w", c.qp.QPN(), err)
	}
	c.wrPosted++
	c.granted.Store(grant)
	return nil
}

// postCredit sends a zero-length credit message if the send queue has
// room; called by the poller.
func (c *Conn) postCredit() (bool, error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.state.Load() != stateOpen || c.wrPosted-c.wrDone.Load() >= c.sqDepth {
		return false, nil
	}
	c.wr[0] = verbs.SendWR{Opcode: verbs.WRSendWithImm}
	if err := c.post(&c.wr[0], true); err != nil {
		return false, err
	}
	return true, nil
}

// Recv returns the next message, waiting for one: the failure once the
// connection failed, ErrClosed once closed.
func (c *Conn) Recv(ctx context.Context) (Message, error) {
	for {
		c.rxMu.Lock()
		if len(c.rxq) > 0 {
			m := c.rxq[0]
			c.rxq[0] = Message{}
			c.rxq = c.rxq[1:]
			c.rxMu.Unlock()
			return m, nil
		}
		switch c.state.Load() {
		case stateFailed:
			err := c.err
			c.rxMu.Unlock()
			return Message{}, err
		case stateClosed:
			c.rxMu.Unlock()
			return Message{}, ErrClosed
		}
		if c.rxWake == nil {
			c.rxWake = make(chan struct{}, 1)
		}
		w := c.rxWake
		c.rxMu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return Message{}, ctx.Err()
		}
	}
}

// deliver hands a message to the handler or the receive queue.
func (c *Conn) deliver(m Message) {
	if c.handler != nil {
		c.handler(c, m)
		return
	}
	c.rxMu.Lock()
	if c.state.Load() == stateClosed {
		c.rxMu.Unlock()
		return
	}
	c.rxq = append(c.rxq, m)
	w := c.rxWake
	c.rxMu.Unlock()
	notify(w)
}

func notify(w chan struct{}) {
	if w != nil {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// fail moves an open conn to failed with err and wakes its users.
func (c *Conn) fail(err error) {
	c.rxMu.Lock()
	if c.state.Load() != stateOpen {
		c.rxMu.Unlock()
		return
	}
	c.err = fmt.Errorf("naive: conn %#x: %w", c.qp.QPN(), err)
	c.state.Store(stateFailed)
	w := c.rxWake
	c.rxMu.Unlock()
	notify(w)
	c.wakeSenders()
}

// Err returns why the connection failed, or nil.
func (c *Conn) Err() error {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	if c.state.Load() != stateFailed {
		return nil
	}
	return c.err
}

// Close closes the connection locally, as an application destroys its QP:
// nothing is sent to the peer (a sender there fails once its retries run
// out). Queued messages are dropped and the Data of unreleased ones becomes
// invalid. The QP, CQ and region are destroyed by the conn's poller soon
// after; Endpoint.Stats().Conns counts them until then.
func (c *Conn) Close() error {
	c.rxMu.Lock()
	if c.state.Load() == stateClosed {
		c.rxMu.Unlock()
		return nil
	}
	c.state.Store(stateClosed)
	clear(c.rxq)
	c.rxq = nil
	w := c.rxWake
	c.rxMu.Unlock()
	notify(w)
	c.wakeSenders()
	return nil
}

// QPN is the number of the connection's QP.
func (c *Conn) QPN() uint32 { return c.qp.QPN() }

var _ io.Closer = (*Conn)(nil)

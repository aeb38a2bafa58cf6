package engine

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// The sender's queue: what Send, SendImm, TrySend and the one-sided
// operations' markers (onesided.go, region.go) queue for the poller, and
// everything about it that the sender owns. The fields of sender are
// touched here alone (TestOwners); the poller consumes through the
// methods at the end of this file.

// ringSize is the depth of a vconn's submission ring. With credits bounding
// what a vconn has in flight, a deep ring would only hold memory.
const ringSize = 16

// ringSpins is how many times a sender finding the ring full yields before
// it parks: one streaming vconn's sender parked every 15-30 messages, and
// parking and waking cost more than the few yields it takes the poller to
// make room (8% more messages a second on the soft provider).
const ringSpins = 4

// sender is a vconn's send queue: a single-producer, single-consumer ring
// of send buffers, and the producer's state. The producer is whoever holds
// mu (Send and its kin, queueEntry); the consumer the poller of the
// vconn's QP (vc.sq.p). Its entries fill two cache lines and the rest one
// more, the line the sender and the poller each read once per message.
type sender struct {
	ents [ringSize]ringEntry // the ring's slots

	mu   sync.Mutex
	seq  uint32        // the next message's sequence; guarded by mu
	head atomic.Uint32 // next to consume; written by the consumer
	tail atomic.Uint32 // next to fill; written by the producer
	// waiting: a producer parked for room; wake is its channel, created
	// by the producer before it sets waiting.
	waiting atomic.Bool
	// closed: CloseWrite, no more sends (set under mu).
	closed atomic.Bool
	// creditWait: the poller found no credit for the queued data; the
	// sender's pushes then leave the poller asleep and out of the QP's
	// backlog, and the peer's grant schedules the vconn (scheduleData).
	// Set under mu (stall), cleared by the grant and by the next serve.
	creditWait atomic.Bool
	// uncounted is how many entries are not in the QP's backlog: taken
	// off it when the vconn stalled for credits (uncountAll), or pushed
	// while it waited for them.
	uncounted atomic.Int32
	wake      chan struct{}
}

// ringEntry is a queued send: a buffer's slot and the length of what it
// holds, or opMarker (onesided.go).
type ringEntry uint64

func newEntry(s bufSlot, n uint32) ringEntry { return ringEntry(s)<<32 | ringEntry(n) }

func (e ringEntry) slot() bufSlot { return bufSlot(e >> 32) }

func (e ringEntry) len() uint32 { return uint32(e) }

// Send sends one message, blocking while the vconn's queue is full (the
// peer is not reading: credits ran out) or its QP's backlog is.
func (vc *VConn) Send(ctx context.Context, data []byte) error {
	_, err := vc.send(ctx, payload{data: data}, 0, false, true)
	return err
}

// SendImm sends one message with an application immediate.
func (vc *VConn) SendImm(ctx context.Context, data []byte, imm uint32) error {
	_, err := vc.send(ctx, payload{data: data}, imm, true, true)
	return err
}

// TrySend sends one message if it fits in the vconn's queue now; it
// reports false, without error, when it does not.
func (vc *VConn) TrySend(data []byte) (bool, error) {
	n, err := vc.send(context.Background(), payload{data: data}, 0, false, false)
	return n > 0, err
}

// TrySendImm is TrySend with an application immediate: a poller serving
// many vconns from one goroutine (the agent's shared-memory rings) must
// not block on one of them.
func (vc *VConn) TrySendImm(data []byte, imm uint32) (bool, error) {
	n, err := vc.send(context.Background(), payload{data: data}, imm, true, false)
	return n > 0, err
}

// SendStaged sends n bytes of s at at as one message, as SendImm (hasImm)
// or Send, without copying them (lend.go): they must stay in place until
// s's returned gives token back, once for each chunk queued (Chunks). It
// returns how many it queued: all, or, with an error, none, unless ctx
// ended midway, which fails the vconn.
func (vc *VConn) SendStaged(ctx context.Context, s *Staging, at, n int, imm uint32, hasImm bool, token uint32) (int, error) {
	switch {
	case s.vc != vc || s.returned == nil:
		return 0, fmt.Errorf("engine: vconn %v: send from staging memory not staged for its sends: %w", vc.id, verbs.ErrInvalid)
	case at < 0 || n < 0 || at > s.Len() || n > s.Len()-at:
		return 0, fmt.Errorf("engine: vconn %v: send of %d bytes at %d outside its %d of staging memory: %w", vc.id, n, at, s.Len(), verbs.ErrInvalid)
	}
	k, err := vc.send(ctx, payload{st: s, at: at, n: n, token: token}, imm, hasImm, true)
	if err == nil {
		vc.e.stats.inPlace.Add(1)
	}
	return k, err
}

// send queues the message pl, in chunks; it returns how many it queued:
// all, or none (err nil: no room now, for a send that must not block).
func (vc *VConn) send(ctx context.Context, pl payload, imm uint32, hasImm, block bool) (int, error) {
	s := &vc.snd
	size := pl.len()
	if max := vc.MaxMessage(); size > max {
		return 0, fmt.Errorf("engine: send %d bytes on %v vconn %v: %w (%d)", size, vc.tr, vc.id, ErrTooLarge, max)
	}
	per := vc.e.cfg.ChunkSize - format.HeaderLen
	chunks := vc.Chunks(size)
	if locked, err := vc.lockSend(ctx, block); !locked {
		return 0, err
	}
	defer s.mu.Unlock()
	if !block && s.free() < chunks {
		return 0, nil
	}
	h := format.DataHeader(uint32(size), s.seq, imm, hasImm)
	for i := 0; i < chunks; i++ {
		h.SetChunk(i == 0, i == chunks-1)
		queued, err := vc.queueChunk(ctx, &h, pl, min(i*per, size), min((i+1)*per, size), block)
		if !queued {
			// Nothing of this message is queued unless i > 0, which only a
			// blocking send reaches; its ctx ended, the vconn is broken.
			if i > 0 {
				vc.fail(fmt.Errorf("engine: message abandoned half-queued: %w", err))
			}
			return i, err
		}
		if chunks > 1 {
			vc.scheduleData()
		}
	}
	s.seq++
	vc.scheduleData()
	return chunks, nil
}

// lockSend takes the sender's lock for a message, once the QP's backlog
// lets it (block; without, only if the lock is free): false, and why
// when it is an error, if the vconn cannot send.
func (vc *VConn) lockSend(ctx context.Context, block bool) (bool, error) {
	s := &vc.snd
	if st := vc.state.Load(); st != stateOpen {
		return false, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
	}
	if block {
		if err := vc.sq.throttle(ctx); err != nil {
			return false, err
		}
		if st := vc.state.Load(); st != stateOpen { // changed while throttled
			return false, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
		}
		s.mu.Lock()
	} else if !s.mu.TryLock() {
		return false, nil
	}
	if s.closed.Load() {
		s.mu.Unlock()
		return false, fmt.Errorf("engine: send on vconn %v: %w (its sending side was closed)", vc.id, ErrClosed)
	}
	return true, nil
}

// FillSize is the most bytes SendFrom puts in one message: a send buffer
// less the header, so that the message is one chunk and its receiver
// hands it on from its receive buffer, without reassembling it.
func (vc *VConn) FillSize() int {
	return min(vc.e.cfg.ChunkSize-format.HeaderLen, vc.MaxMessage())
}

// FillSmall is a size for SendFrom whose buffer is one of the engine's
// small ones (2 KiB) rather than a chunk: for a source whose reads come
// short (requests, not a stream), so that each does not hold a chunk's
// buffer until it is sent (on Auto, acknowledged).
const FillSmall = midBuffer - format.HeaderLen

// midBuffer is the size of the pool's middle class of send buffers
// (engine.go), between the small messages' and the chunks'.
const midBuffer = 2048

// SendFrom sends one message of at most max bytes (FillSize at most) that
// read writes straight into the engine's registered send buffer: for a
// source that is itself a copy (a socket's read), one copy fewer than
// Send. It waits as Send does for the queue, a buffer and room in the
// ring, and only then calls read, once, with the sender's lock held: read
// must not wait (a non-blocking socket's read). A read of 0 bytes sends
// nothing and returns read's error, or io.ErrNoProgress.
func (vc *VConn) SendFrom(ctx context.Context, max int, read func([]byte) (int, error)) (int, error) {
	s, e := &vc.snd, vc.e
	per := min(max, vc.FillSize())
	if per <= 0 {
		return 0, fmt.Errorf("engine: send from a read of %d bytes: %w", max, verbs.ErrInvalid)
	}
	if locked, err := vc.lockSend(ctx, true); !locked {
		return 0, err
	}
	defer s.mu.Unlock()
	slot, err := vc.reserve(ctx, format.HeaderLen+per, true)
	if err != nil {
		return 0, err
	}
	b := e.pool.bytes(slot)
	n, err := read(b[format.HeaderLen : format.HeaderLen+per])
	if n <= 0 {
		e.pool.put(slot)
		if err == nil {
			err = io.ErrNoProgress
		}
		return 0, err
	}
	h := format.DataHeader(uint32(n), s.seq, 0, false)
	h.SetChunk(true, true)
	h.Put(b)
	vc.push(newEntry(slot, uint32(format.HeaderLen+n)))
	s.seq++
	vc.scheduleData()
	return n, nil
}

// queueChunk queues bytes from..to of pl as one chunk behind its header h:
// copied into a send buffer after it, or, staged, left in place (lend.go)
// with the header alone in a small buffer. It reports false when it
// queued nothing: no buffer free (a TrySend's, err nil), or err. The
// sender, holding mu.
func (vc *VConn) queueChunk(ctx context.Context, h *format.Header, pl payload, from, to int, block bool) (bool, error) {
	n := format.HeaderLen + to - from
	room := n
	if pl.st != nil {
		if err := pl.st.acquire(); err != nil {
			return false, fmt.Errorf("engine: vconn %v: %w", vc.id, err)
		}
		room = format.HeaderLen
	}
	slot, err := vc.reserve(ctx, room, block)
	if err != nil || slot == noSlot {
		if pl.st != nil {
			pl.st.done(false)
		}
		return false, err
	}
	if err := vc.e.poolUse(); err != nil {
		vc.e.pool.put(slot)
		if pl.st != nil {
			pl.st.done(false)
		}
		return false, fmt.Errorf("engine: vconn %v: %w", vc.id, err)
	}
	b := vc.e.pool.bytes(slot)
	h.Put(b)
	if pl.st != nil {
		vc.e.pool.lend(slot, lentRef{st: pl.st, at: uint32(pl.at + from), n: uint32(to - from), token: pl.token})
	} else {
		copy(b[format.HeaderLen:], pl.data[from:to])
	}
	vc.e.poolDone()
	vc.push(newEntry(slot, uint32(n)))
	return true, nil
}

// reserve takes a send buffer for n bytes and waits for room in the ring
// for it (block; without, neither waits): noSlot, without error, when no
// buffer is free. The sender, holding mu, so the room stays until its push.
func (vc *VConn) reserve(ctx context.Context, n int, block bool) (bufSlot, error) {
	slot, err := vc.getBuffer(ctx, n, block)
	if err != nil || slot == noSlot {
		return noSlot, err
	}
	if err := vc.waitRing(ctx, block); err != nil {
		vc.e.pool.put(slot)
		return noSlot, err
	}
	return slot, nil
}

// queueEntry queues one entry that is not a message's (a one-sided
// operation's marker, a control message about a region) in order with
// the vconn's messages: under the sender's lock and once the ring has
// room, make returns it (or an error, and queues nothing). It blocks.
func (vc *VConn) queueEntry(ctx context.Context, make func() (ringEntry, error)) error {
	s := &vc.snd
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := vc.waitRing(ctx, true); err != nil {
		return err
	}
	ent, err := make()
	if err != nil {
		return err
	}
	vc.push(ent)
	vc.schedule()
	return nil
}

// push queues a ring entry; the caller (the vconn's sender) holds mu and
// checked free.
func (vc *VConn) push(ent ringEntry) {
	s := &vc.snd
	t := s.tail.Load()
	s.ents[t%ringSize] = ent
	s.tail.Store(t + 1)
	if s.creditWait.Load() {
		s.uncounted.Add(1) // it waits for the peer's reader, not for the QP
		return
	}
	vc.sq.backlog.Add(1)
}

// getBuffer takes a send buffer for n bytes, waiting for one if the pool is
// empty and block is set. The wait ends on a buffer's return, the context,
// or (checked every 10 ms) the vconn failing.
func (vc *VConn) getBuffer(ctx context.Context, n int, block bool) (bufSlot, error) {
	p := vc.e.pool
	ci := p.class(n)
	for {
		if slot, ok := p.get(ci); ok {
			return slot, nil
		}
		if !block {
			return noSlot, nil
		}
		if err := vc.sendable(ctx); err != nil {
			return noSlot, err
		}
		tctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		p.wait(ci, tctx.Done())
		cancel()
	}
}

// waitRing waits for room in the ring.
func (vc *VConn) waitRing(ctx context.Context, block bool) error {
	s := &vc.snd
	for spin := 0; s.free() == 0; spin++ {
		if !block {
			return fmt.Errorf("engine: vconn %v queue full", vc.id)
		}
		if spin < ringSpins {
			// The poller is draining the ring, or about to: yielding a
			// few times costs less than parking and being woken.
			vc.scheduleData()
			runtime.Gosched()
			continue
		}
		if s.wake == nil {
			s.wake = make(chan struct{}, 1)
		}
		s.waiting.Store(true)
		vc.scheduleData()
		if s.free() > 0 {
			break
		}
		if err := vc.sendable(ctx); err != nil {
			return err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (vc *VConn) sendable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if vc.state.Load() != stateOpen {
		return fmt.Errorf("engine: vconn %v: %w", vc.id, vc.stateErr())
	}
	return nil
}

// scheduleData schedules the vconn for the data its sender queued, unless
// it waits for the peer's credits: then the grant schedules it (grant),
// and a wake-up would only find the poller stalled again. The sender's
// goroutine, after its push.
func (vc *VConn) scheduleData() {
	if !vc.snd.creditWait.Load() {
		vc.schedule()
	}
}

// closeWrite closes the sending side: under mu, so that no send is
// between its check and its push, and the FIN, which goes once the ring
// is empty, follows every message.
func (s *sender) closeWrite() {
	s.mu.Lock()
	s.closed.Store(true)
	s.mu.Unlock()
}

// The consumer's side, and what either side may ask.

// wakeSender wakes a producer waiting for ring space. The poller, as it
// consumes the ring; or whoever fails or releases the vconn.
func (s *sender) wakeSender() {
	// Load before Swap: the common case (nobody waits) stays a read.
	if s.waiting.Load() && s.waiting.Swap(false) {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// peek returns the oldest entry without consuming it. The consumer (the
// QP's poller) only.
func (s *sender) peek() (ringEntry, bool) {
	h := s.head.Load()
	if h == s.tail.Load() {
		return 0, false
	}
	return s.ents[h%ringSize], true
}

// at returns the entry i places behind the oldest, if there is one. The
// consumer only.
func (s *sender) at(i int) (ringEntry, bool) {
	h := s.head.Load()
	if int(s.tail.Load()-h) <= i {
		return 0, false
	}
	return s.ents[(h+uint32(i))%ringSize], true
}

// pop consumes the oldest entry, and reports whether it was in the QP's
// backlog (see uncounted). The consumer only.
func (s *sender) pop() (counted bool) {
	s.head.Add(1)
	if s.uncounted.Load() > 0 {
		s.uncounted.Add(-1)
		return false
	}
	return true
}

// len is the number of entries queued; free, the room left; empty, none
// queued. Either side (the producer's view may only grow free, the
// consumer's only shrink it).
func (s *sender) len() int { return int(s.tail.Load() - s.head.Load()) }

func (s *sender) free() int { return ringSize - s.len() }

func (s *sender) empty() bool { return s.head.Load() == s.tail.Load() }

// stall marks the sender as waiting for the peer's credits (the poller,
// at creditStall), if it can take mu without waiting, and reports
// whether it did: then no push falls between the flag and the poller's
// count of what is queued, until endStall. A sender holding mu is parked
// for room in the ring and pushes nothing meanwhile; its next pushes wake
// the poller as before the flag.
func (s *sender) stall() (locked bool) {
	locked = s.mu.TryLock()
	if locked {
		s.creditWait.Store(true)
	}
	return locked
}

// uncountAll takes what is queued off the QP's backlog, as far as it is
// in it, and returns how many entries that is. The consumer, stalling.
func (s *sender) uncountAll() int32 {
	k := int32(s.len()) - s.uncounted.Load()
	if k <= 0 {
		return 0
	}
	s.uncounted.Add(k)
	return k
}

func (s *sender) endStall(locked bool) {
	if locked {
		s.mu.Unlock()
	}
}

// unstall clears creditWait: the peer granted credits, or the poller
// serves the vconn anyway.
func (s *sender) unstall() {
	if s.creditWait.Load() {
		s.creditWait.Store(false)
	}
}

// maxBundle is the most messages one bundle carries: a ring's worth, which
// is what the format allows. bundleFitsRing fails to compile if the two
// part (one of its conversions overflows); TestBundleFitsRing says so too.
const (
	maxBundle      = ringSize
	bundleFitsRing = uint(maxBundle-format.MaxBundle) + uint(format.MaxBundle-maxBundle)
)

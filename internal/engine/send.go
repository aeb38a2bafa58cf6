package engine

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
)

// Send sends one message, blocking while the vconn's queue is full (the
// peer is not reading: credits ran out) or its QP's backlog is.
func (vc *VConn) Send(ctx context.Context, data []byte) error {
	_, err := vc.send(ctx, data, 0, false, true)
	return err
}

// SendImm sends one message with an application immediate.
func (vc *VConn) SendImm(ctx context.Context, data []byte, imm uint32) error {
	_, err := vc.send(ctx, data, imm, true, true)
	return err
}

// TrySend sends one message if it fits in the vconn's queue now; it
// reports false, without error, when it does not.
func (vc *VConn) TrySend(data []byte) (bool, error) {
	return vc.send(context.Background(), data, 0, false, false)
}

func (vc *VConn) send(ctx context.Context, data []byte, imm uint32, hasImm, block bool) (bool, error) {
	e := vc.e
	if max := vc.MaxMessage(); len(data) > max {
		return false, fmt.Errorf("engine: send %d bytes on %v vconn %v: %w (%d)", len(data), vc.tr, vc.id, ErrTooLarge, max)
	}
	if st := vc.state.Load(); st != stateOpen {
		return false, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
	}
	per := e.cfg.ChunkSize - format.HeaderLen
	chunks := max(1, (len(data)+per-1)/per)
	if block {
		if err := vc.sq.throttle(ctx); err != nil {
			return false, err
		}
		if st := vc.state.Load(); st != stateOpen { // changed while throttled
			return false, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
		}
		vc.sendMu.Lock()
	} else if !vc.sendMu.TryLock() {
		return false, nil
	}
	defer vc.sendMu.Unlock()
	if vc.wrClosed.Load() {
		return false, fmt.Errorf("engine: send on vconn %v: %w (its sending side was closed)", vc.id, ErrClosed)
	}
	if !block && vc.ring.free() < chunks {
		return false, nil
	}
	h := format.DataHeader(uint32(len(data)), vc.txSeq, imm, hasImm)
	for i := 0; i < chunks; i++ {
		part := data[min(i*per, len(data)):min((i+1)*per, len(data))]
		h.SetChunk(i == 0, i == chunks-1)
		slot, err := vc.getBuffer(ctx, format.HeaderLen+len(part), block)
		if err != nil || slot == noSlot {
			// Nothing of this message is queued unless i > 0, which only a
			// blocking send reaches; its ctx ended, the vconn is broken.
			if i > 0 {
				vc.fail(fmt.Errorf("engine: message abandoned half-queued: %w", err))
			}
			return false, err
		}
		b := e.pool.bytes(slot)
		h.Put(b)
		copy(b[format.HeaderLen:], part)
		if err := vc.waitRing(ctx, block); err != nil {
			e.pool.put(slot)
			if i > 0 {
				vc.fail(fmt.Errorf("engine: message abandoned half-queued: %w", err))
			}
			return false, err
		}
		vc.push(newEntry(slot, uint32(format.HeaderLen+len(part))))
		if chunks > 1 {
			vc.scheduleData()
		}
	}
	vc.txSeq++
	vc.scheduleData()
	return true, nil
}

// push queues a ring entry; the caller (the vconn's sender) holds sendMu
// and checked free.
func (vc *VConn) push(ent ringEntry) {
	vc.ring.push(&vc.ents, ent)
	if vc.creditWait.Load() {
		vc.uncounted.Add(1) // it waits for the peer's reader, not for the QP
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
	for spin := 0; vc.ring.free() == 0; spin++ {
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
		if vc.txWake == nil {
			vc.txWake = make(chan struct{}, 1)
		}
		vc.txWaiting.Store(true)
		vc.scheduleData()
		if vc.ring.free() > 0 {
			break
		}
		if err := vc.sendable(ctx); err != nil {
			return err
		}
		select {
		case <-vc.txWake:
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

// wakeSender wakes a producer waiting for ring space. The poller, as it
// consumes the ring; or whoever fails or releases the vconn.
func (vc *VConn) wakeSender() {
	// Load before Swap: the common case (nobody waits) stays a read.
	if vc.txWaiting.Load() && vc.txWaiting.Swap(false) {
		select {
		case vc.txWake <- struct{}{}:
		default:
		}
	}
}

// scheduleData schedules the vconn for the data its sender queued, unless
// it waits for the peer's credits: then the grant schedules it (grant),
// and a wake-up would only find the poller stalled again. The sender's
// goroutine, after its push.
func (vc *VConn) scheduleData() {
	if !vc.creditWait.Load() {
		vc.schedule()
	}
}

// schedule puts the vconn on its poller's run queue, once until served.
// Any goroutine.
func (vc *VConn) schedule() {
	if !vc.scheduled.Swap(true) {
		vc.sq.p.enqueue(vc)
	}
}

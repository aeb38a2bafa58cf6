package engine

import (
	"context"
	"fmt"
	"io"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
)

// FillSize is the most bytes SendFrom puts in one message: a send buffer
// less the header, so that the message is one chunk and its receiver
// hands it on from its receive buffer, without reassembling it.
func (vc *VConn) FillSize() int {
	return min(vc.e.cfg.ChunkSize-format.HeaderLen, vc.MaxMessage())
}

// SendFrom sends one message of at most FillSize bytes that read writes
// straight into the engine's registered send buffer: for a source that
// is itself a copy (a socket's read), one copy fewer than Send. It waits
// as Send does for the queue, a buffer and room in the ring, and only
// then calls read, once, with the vconn's send lock held: read must not
// wait long (a socket known to be readable). A read of 0 bytes sends
// nothing and returns read's error, or io.ErrNoProgress.
func (vc *VConn) SendFrom(ctx context.Context, read func([]byte) (int, error)) (int, error) {
	e := vc.e
	if err := vc.sq.throttle(ctx); err != nil {
		return 0, err
	}
	if st := vc.state.Load(); st != stateOpen {
		return 0, fmt.Errorf("engine: send on vconn %v: %w", vc.id, vc.stateErr())
	}
	vc.sendMu.Lock()
	defer vc.sendMu.Unlock()
	if vc.wrClosed.Load() {
		return 0, fmt.Errorf("engine: send on vconn %v: %w (its sending side was closed)", vc.id, ErrClosed)
	}
	per := vc.FillSize()
	slot, err := vc.getBuffer(ctx, format.HeaderLen+per, true)
	if err != nil {
		return 0, err
	}
	if err := vc.waitRing(ctx, true); err != nil {
		e.pool.put(slot)
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
	h := format.DataHeader(uint32(n), vc.txSeq, 0, false)
	h.SetChunk(true, true)
	h.Put(b)
	vc.push(newEntry(slot, uint32(format.HeaderLen+n)))
	vc.txSeq++
	vc.scheduleData()
	return n, nil
}

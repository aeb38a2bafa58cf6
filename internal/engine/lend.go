package engine

import (
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Sending from staging memory in place (SendStaged): a message whose bytes
// lie in memory the caller registered for its vconn (Staging, the agent's
// mapping of a pod's shared-memory TX ring) is queued without copying
// them. Each chunk's header goes in a small send buffer of the pool, and
// its work request gathers the header from there and the payload from the
// staging memory, as a NIC reads both by DMA. The header stays the
// engine's own: the pod can rewrite its payload while it is sent (its own
// bytes), never the header a peer trusts.
//
// The pool's table lent records, per header buffer, where its payload
// lies; whoever frees the buffer (its send's completion, Auto's
// acknowledgement, a dead vconn's drain) gives the payload back to the
// caller first (Staging.returned), so the caller's bytes stay in place
// exactly as long as a work request may read them, retransmissions
// included.

// lentRef is where a header buffer's payload lies: n bytes at at of st,
// and the caller's token for it.
type lentRef struct {
	st    *Staging
	at, n uint32
	token uint32
}

// lend records that the header buffer slot (class 0) goes with r.
func (p *bufPool) lend(slot bufSlot, r lentRef) { p.lent[slot.index()] = r }

// lentOf returns the staged payload slot's header goes with, or nil.
func (p *bufPool) lentOf(slot bufSlot) *lentRef {
	if slot.class() != 0 {
		return nil
	}
	if r := &p.lent[slot.index()]; r.st != nil {
		return r
	}
	return nil
}

// sge describes the payload in its staging memory.
func (r *lentRef) sge() verbs.SGE {
	return verbs.SGE{Addr: r.st.mr.Addr() + uint64(r.at), Length: r.n, LKey: r.st.mr.LKey()}
}

// bytes is the payload, for a bundle that copies it.
func (r *lentRef) bytes() []byte { return r.st.mr.Bytes()[r.at : r.at+r.n] }

// give hands the payload back to its caller and forgets it; the header
// buffer's owner, as it frees the buffer.
func (r *lentRef) give() {
	st, token := r.st, r.token
	*r = lentRef{}
	st.returned(token)
	st.done(false)
}

// StageSends is Stage for memory the vconn also sends from in place
// (SendStaged). returned runs once for each chunk a SendStaged queued,
// with that call's token, when no work request will read the chunk again;
// it runs on a poller and must not block. released runs as Stage says
// (before an error is returned too), or when the engine closes with sends
// still holding the memory: no device reads it after either.
func (vc *VConn) StageSends(mem []byte, returned func(token uint32), released func()) (*Staging, error) {
	if returned == nil {
		if released != nil {
			released()
		}
		return nil, fmt.Errorf("engine: staging sends on vconn %v without a returned: %w", vc.id, verbs.ErrInvalid)
	}
	s, err := vc.Stage(mem, released)
	if err != nil {
		return nil, err
	}
	s.returned = returned
	e := vc.e
	e.graceMu.Lock()
	if e.closed.Load() { // releaseLending ran, or runs without s
		e.graceMu.Unlock()
		_ = s.release()
		return nil, fmt.Errorf("engine: staging sends on vconn %v: %w", vc.id, ErrEngineClosed)
	}
	if e.lending == nil {
		e.lending = make(map[*Staging]struct{})
	}
	e.lending[s] = struct{}{}
	e.graceMu.Unlock()
	return s, nil
}

// releaseLending deregisters, as the engine closes (its pollers stopped),
// the staging memory sends may still read: no completion will give their
// payloads back, and no device reads them any more.
func (e *Engine) releaseLending() {
	e.graceMu.Lock()
	left := e.lending
	e.lending = nil
	e.graceMu.Unlock()
	for s := range left {
		_ = s.release()
	}
}

// unlend forgets s as it is deregistered.
func (s *Staging) unlend() {
	e := s.vc.e
	e.graceMu.Lock()
	delete(e.lending, s)
	e.graceMu.Unlock()
}

// Chunks is how many chunks (receive buffers, credits) a message of n
// bytes takes: SendStaged's returned runs once for each.
func (vc *VConn) Chunks(n int) int {
	per := vc.e.cfg.ChunkSize - format.HeaderLen
	return max(1, (n+per-1)/per)
}

// payload is a message's bytes as send queues them: data, copied, or,
// with st, n bytes at at, in place.
type payload struct {
	data  []byte
	st    *Staging
	at, n int
	token uint32
}

func (pl *payload) len() int {
	if pl.st != nil {
		return pl.n
	}
	return len(pl.data)
}

// copyEntry copies a queued entry's n bytes, header and payload, wherever
// its payload lies, into dst: a bundle's copy.
func (p *poller) copyEntry(dst []byte, slot bufSlot, n uint32) int {
	b := p.e.pool.bytes(slot)
	if r := p.e.pool.lentOf(slot); r != nil {
		k := copy(dst, b[:format.HeaderLen])
		return k + copy(dst[k:], r.bytes())
	}
	return copy(dst, b[:n])
}

package engine

import (
	"errors"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Close fails every vconn, destroys the QPs and releases the device
// resources. The device itself stays open: it is the caller's.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	e.peersMu.Lock()
	peers := make([]*Peer, 0, len(e.peers))
	for _, p := range e.peers {
		peers = append(peers, p)
	}
	e.peersMu.Unlock()
	for _, p := range peers {
		p.fail(ErrEngineClosed)
		// Exported regions are deregistered with the PD: no peer can
		// reach them once the QPs are gone.
		p.mu.Lock()
		for vc := p.list; vc != nil; vc = vc.next {
			vc.releaseRegions()
		}
		p.mu.Unlock()
	}
	for _, p := range e.pollers {
		p.stop()
	}
	e.redials.Wait()
	e.releaseGraced()
	e.graceWG.Wait()
	e.releaseLending()
	var errs []error
	e.peersMu.Lock()
	peers = append(peers, e.retired...)
	e.retired = nil
	e.peersMu.Unlock()
	for _, p := range peers {
		errs = append(errs, p.destroy())
	}
	e.poolMu.Lock() // the writers inside poolUse are out; later ones see closed
	e.poolMu.Unlock()
	errs = append(errs, e.release())
	return errors.Join(errs...)
}

// poolUse lets an application's goroutine write into a send buffer it
// holds, until poolDone; false, and nothing held, once the engine closes.
func (e *Engine) poolUse() error {
	e.poolMu.RLock()
	if e.closed.Load() {
		e.poolMu.RUnlock()
		return ErrEngineClosed
	}
	return nil
}

func (e *Engine) poolDone() { e.poolMu.RUnlock() }

// release frees what New allocated, in reverse order.
func (e *Engine) release() error {
	var errs []error
	for _, p := range e.pollers {
		errs = append(errs, p.close())
	}
	for _, s := range []verbs.SRQ{e.srq, e.dsrq} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	if e.pool != nil {
		errs = append(errs, e.pool.close())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	return errors.Join(errs...)
}

package wire

import (
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// FaultSetter is implemented by the Wire WithFaults returns: it changes the
// faults at run time (the generator restarts from the new seed).
type FaultSetter interface {
	SetFaults(Faults)
}

// WithFaults returns a Wire that applies f to every packet sent on w, with
// the same fault model (and the same decisions for the same seed, GID and
// send sequence) as the Fabric. It owns w: Close closes w. Recv is w's.
//
// Packets that go out at once are passed to w.Send in the caller's buffers;
// held and delayed ones are copied into the decorator's pool first and sent
// later from the timer goroutine, so w.Send must be safe for concurrent use
// (every Wire here is). Stats are w's plus the fault model's counters.
func WithFaults(w Wire, f Faults) Wire {
	fw := &faultWire{inner: w, sched: newSched()}
	fw.f = newFaulter(f, w.LocalGID(), &fw.pool, fw.sched, &fw.cnt, fw.transmit)
	if fw.f.cfg.timed() {
		fw.sched.setEnabled(true)
	}
	return fw
}

// faultWire is the WithFaults decorator. f.mu is its send lock and guards
// batch and err as well.
type faultWire struct {
	inner  Wire
	f      *faulter
	sched  *sched
	pool   pool
	cnt    counters
	closed atomic.Bool

	batch []Packet
	err   error // the inner wire's last Send error, returned by Send
}

var (
	_ Wire        = (*faultWire)(nil)
	_ FaultSetter = (*faultWire)(nil)
	_ FaultSetter = (*Fabric)(nil)
)

func (w *faultWire) LocalGID() verbs.GID { return w.inner.LocalGID() }

// PortState is the inner wire's, if it watches a link; faults model the
// path, not the port.
func (w *faultWire) PortState() (verbs.PortState, error) {
	if w.closed.Load() {
		return 0, errClosed
	}
	if p, ok := w.inner.(interface {
		PortState() (verbs.PortState, error)
	}); ok {
		return p.PortState()
	}
	return verbs.PortStateActive, nil
}

func (w *faultWire) Recv(pkts []Packet) (int, error) { return w.inner.Recv(pkts) }

func (w *faultWire) Stats() Stats {
	s := w.inner.Stats()
	d := w.cnt.snapshot()
	s.add(&d)
	return s
}

func (w *faultWire) SetFaults(f Faults) {
	w.f.mu.Lock()
	w.f.configure(f)
	timed := w.f.cfg.timed()
	w.f.mu.Unlock()
	if !w.closed.Load() {
		w.sched.setEnabled(timed)
	}
}

// Send runs pkts through the fault model and sends what leaves now in one
// inner Send. If the inner wire fails, Send returns 0 and its error.
func (w *faultWire) Send(pkts []Packet) (int, error) {
	f := w.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if w.closed.Load() {
		return 0, errClosed
	}
	f.sendAll(pkts)
	if err := w.err; err != nil {
		w.err = nil
		return 0, err
	}
	return len(pkts), nil
}

// transmit is the decorator's sink: one inner Send for the whole batch.
func (w *faultWire) transmit(out []outPkt) {
	f := w.f
	for i := range out {
		if o := &out[i]; o.buf != nil {
			w.batch = append(w.batch, Packet{Buf: o.buf.b, N: o.buf.n, Addr: o.buf.dst})
		} else {
			w.batch = append(w.batch, *o.ref)
		}
	}
	n, err := w.inner.Send(w.batch)
	if err != nil {
		w.err = err
		f.st.SendErrors += uint64(len(w.batch) - n)
	}
	for i := range out {
		if b := out[i].buf; b != nil {
			f.cache.put(b)
		}
	}
	clear(w.batch) // drop references to the caller's buffers
	w.batch = w.batch[:0]
}

// Close drops what the fault model held or delayed (Stats.DropClosed),
// stops the timer goroutine and closes the inner wire.
func (w *faultWire) Close() error {
	if w.closed.Swap(true) {
		return nil
	}
	f := w.f
	f.mu.Lock()
	f.releaseAll(false)
	f.flush()
	f.mu.Unlock()
	pending := w.sched.close()
	w.cnt.dropClosed.Add(uint64(len(pending)))
	return w.inner.Close()
}

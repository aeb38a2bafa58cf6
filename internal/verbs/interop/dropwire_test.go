package interop

import (
	"encoding/binary"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/roce"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// dropWire decorates the host's UDP wire with one-shot drops: the n-th
// packet of an opcode, sent or received, to or for one QP, never reaches
// its destination, which forces the peer (or us) to recover.
type dropWire struct {
	wire.Wire
	mu     sync.Mutex
	tx, rx *dropRule      // guarded by mu
	watch  func(b []byte) // guarded by mu: sees each packet received
}

// dropRule drops the skip+1-th packet with this opcode and destination QPN.
type dropRule struct {
	op      roce.Opcode
	qpn     uint32
	skip    int
	dropped int
}

func (r *dropRule) match(b []byte) bool {
	if r == nil || r.dropped > 0 || len(b) < roce.BTHLen || roce.Opcode(b[0]) != r.op ||
		binary.BigEndian.Uint32(b[4:])&roce.Mask24 != r.qpn {
		return false
	}
	if r.skip > 0 {
		r.skip--
		return false
	}
	r.dropped++
	return true
}

// arm installs rules (nil: none) and returns a function that disarms them
// and says how many packets each dropped.
func (w *dropWire) arm(tx, rx *dropRule) (done func() (txDropped, rxDropped int)) {
	w.mu.Lock()
	w.tx, w.rx = tx, rx
	w.mu.Unlock()
	return func() (int, int) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.tx, w.rx = nil, nil
		n := func(r *dropRule) int {
			if r == nil {
				return 0
			}
			return r.dropped
		}
		return n(tx), n(rx)
	}
}

func (w *dropWire) Send(pkts []wire.Packet) (int, error) {
	w.mu.Lock()
	if w.tx == nil {
		w.mu.Unlock()
		return w.Wire.Send(pkts)
	}
	// Sends run concurrently: each filters into a slice of its own.
	keep := make([]wire.Packet, 0, len(pkts))
	for _, p := range pkts {
		if !w.tx.match(p.Buf[:p.N]) {
			keep = append(keep, p)
		}
	}
	w.mu.Unlock()
	if _, err := w.Wire.Send(keep); err != nil {
		return 0, err
	}
	return len(pkts), nil
}

func (w *dropWire) Recv(pkts []wire.Packet) (int, error) {
	for {
		n, err := w.Wire.Recv(pkts)
		if err != nil || n == 0 {
			return n, err
		}
		w.mu.Lock()
		j := 0
		for i := range n {
			if w.watch != nil {
				w.watch(pkts[i].Buf[:pkts[i].N])
			}
			if w.rx != nil && w.rx.match(pkts[i].Buf[:pkts[i].N]) {
				continue
			}
			pkts[i], pkts[j] = pkts[j], pkts[i] // keep every buffer in the slice
			j++
		}
		w.mu.Unlock()
		if j > 0 {
			return j, nil
		}
	}
}

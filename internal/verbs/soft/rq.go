package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// rq is a receive work queue: a QP's own, or the one inside an SRQ. It has
// its own lock because an SRQ is fed by the application and drained by the
// receive loop on behalf of many QPs.
type rq struct {
	mu     sync.Mutex
	ring   []verbs.RecvWR // guarded by mu
	head   int            // guarded by mu
	n      int            // guarded by mu
	maxSGE int
}

func newRQ(size, maxSGE int) *rq {
	return &rq{ring: make([]verbs.RecvWR, size), maxSGE: maxSGE}
}

func (r *rq) post(wrs []verbs.RecvWR) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range wrs {
		if int(wrs[i].NumSGE) > r.maxSGE {
			return i, fmt.Errorf("soft: post recv: %d SGEs, queue allows %d: %w", wrs[i].NumSGE, r.maxSGE, verbs.ErrInvalid)
		}
		if r.n == len(r.ring) {
			return i, fmt.Errorf("soft: post recv: %w", verbs.ErrQueueFull)
		}
		j := r.head + r.n
		if j >= len(r.ring) {
			j -= len(r.ring)
		}
		r.ring[j] = wrs[i]
		r.n++
	}
	return len(wrs), nil
}

// take removes the oldest receive WR.
func (r *rq) take(out *verbs.RecvWR) bool {
	r.mu.Lock()
	if r.n == 0 {
		r.mu.Unlock()
		return false
	}
	*out = r.ring[r.head]
	r.head++
	if r.head == len(r.ring) {
		r.head = 0
	}
	r.n--
	r.mu.Unlock()
	return true
}

func (r *rq) clear() {
	r.mu.Lock()
	r.head, r.n = 0, 0
	r.mu.Unlock()
}

type srq struct {
	pd     *pd
	rq     *rq
	users  atomic.Int64
	closed atomic.Bool
}

var _ verbs.SRQ = (*srq)(nil)

// CreateSRQ creates a shared receive queue.
func (p *pd) CreateSRQ(attr *verbs.SRQInitAttr) (verbs.SRQ, error) {
	if p.closed.Load() {
		return nil, fmt.Errorf("soft: create srq: %w", verbs.ErrClosed)
	}
	if attr == nil || attr.MaxWR == 0 || attr.MaxWR > maxSRQWR || attr.MaxSGE > verbs.MaxSGE {
		return nil, fmt.Errorf("soft: create srq %+v: %w", attr, verbs.ErrInvalid)
	}
	maxSGE := int(attr.MaxSGE)
	if maxSGE == 0 {
		maxSGE = 1
	}
	p.children.Add(1)
	return &srq{pd: p, rq: newRQ(int(attr.MaxWR), maxSGE)}, nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) (int, error) { return s.rq.post(wrs) }

func (s *srq) Close() error {
	if n := s.users.Load(); n > 0 {
		return fmt.Errorf("soft: destroy srq: %d QPs still use it: %w", n, verbs.ErrBusy)
	}
	if s.closed.Swap(true) {
		return fmt.Errorf("soft: destroy srq: %w", verbs.ErrClosed)
	}
	s.pd.children.Add(-1)
	return nil
}

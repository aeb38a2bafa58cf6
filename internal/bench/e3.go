package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// E3 modes.
const (
	modeMutex  = "mutex"
	modeEngine = "engine"
)

// runE3 measures K producers sharing one QP, each sending 64-byte messages
// as fast as it can (the two modes' runs alternate, Plan.Repeats times):
//   - mutex: a straightforward shared-QP application. The K goroutines
//     share one raw RC QP through a sync.Mutex; each message is one
//     signaled work request posted inline under the mutex (a doorbell per
//     message), waiting on a sync.Cond while the send queue is full; one
//     goroutine polls the send CQ and one the receive CQ, which reposts
//     receive buffers in batches; idle, they sleep a moment (poll).
//   - engine: K vconns on an engine with QPsPerPeer 1, so they share one
//     QP, one producer goroutine per vconn calling Send.
func runE3(ctx context.Context, e *env) error {
	modes := []string{modeMutex, modeEngine}
	for _, k := range e.Plan.E3Producers {
		ss := map[string]*series{}
		for _, mode := range modes {
			ss[mode] = &series{rec: Record{Suite: "e3", Mode: mode, QPs: 1, Producers: k, MsgBytes: e.Plan.MsgBytes}}
		}
		for rep := 0; rep < e.Plan.Repeats; rep++ {
			for _, mode := range modes {
				if ss[mode].err != nil {
					continue
				}
				e.Log.Info("Measuring", "suite", "e3", "mode", mode, "producers", k, "run", rep+1)
				r, err := e3Once(ctx, e, mode, k)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				ss[mode].add(r, err)
			}
		}
		for _, mode := range modes {
			if err := e.emit(ss[mode].record(false)); err != nil {
				return err
			}
		}
	}
	return nil
}

func e3Once(ctx context.Context, e *env, mode string, k int) (_ rate, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.Plan.Timeout)
	defer cancel()
	tb, err := openTestbed(e.wireFor("e3"))
	if err != nil {
		return rate{}, err
	}
	defer func() {
		if cerr := tb.close(); cerr != nil && err == nil {
			err = fmt.Errorf("tear down: %w", cerr)
		}
	}()
	msg := make([]byte, e.Plan.MsgBytes)
	if mode == modeMutex {
		return e3Mutex(ctx, e, tb, k, msg)
	}
	rx := &counter{}
	d, err := openEngines(tb, engine.Config{Pollers: 1, QPsPerPeer: 1}, transport.RC, rx)
	if err != nil {
		return rate{}, err
	}
	defer func() {
		if cerr := d.close(); cerr != nil && err == nil {
			err = fmt.Errorf("tear down: %w", cerr)
		}
	}()
	senders, err := openPairs(ctx, d, k)
	if err != nil {
		return rate{}, err
	}
	if q := d.a.Stats().QPs; q != 1 {
		return rate{}, fmt.Errorf("engine opened %d QPs, want 1", q)
	}
	return drive(ctx, senders, k, msg, rx, e.Plan.Warmup, e.Plan.Measure)
}

// Shared-QP application sizes.
const (
	mutexSQDepth   = 256
	mutexRecvDepth = 4096
	mutexRecvSize  = 256
)

// sharedQP is the mutex mode's application: one RC QP from device a to a
// QP on device b.
type sharedQP struct {
	pd     [2]verbs.PD
	cq     [2]verbs.CQ
	qp     [2]verbs.QP
	mr     verbs.MR // b's receive buffers
	inline []byte   // the producers' messages, msgLen bytes each

	mu        sync.Mutex
	cond      sync.Cond
	wr        [1]verbs.SendWR // guarded by mu
	posted    uint64          // guarded by mu
	waiting   atomic.Int32
	completed atomic.Uint64 // send completions
	stop      atomic.Bool
	err       atomic.Pointer[error]
}

func e3Mutex(ctx context.Context, e *env, tb *testbed, k int, msg []byte) (_ rate, err error) {
	s := &sharedQP{inline: make([]byte, k*len(msg))}
	s.cond.L = &s.mu
	defer func() { err = errors.Join(err, s.close()) }()
	for i, d := range tb.devs {
		if s.pd[i], err = d.AllocPD(); err != nil {
			return rate{}, err
		}
		if s.cq[i], err = d.CreateCQ(mutexSQDepth + mutexRecvDepth); err != nil {
			return rate{}, err
		}
		if s.qp[i], err = s.pd[i].CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: s.cq[i], RecvCQ: s.cq[i],
			Cap: verbs.QPCap{MaxSendWR: mutexSQDepth, MaxRecvWR: mutexRecvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(len(msg))}}); err != nil {
			return rate{}, err
		}
	}
	if s.mr, err = s.pd[1].RegMR(mutexRecvDepth*mutexRecvSize, verbs.AccessLocalWrite); err != nil {
		return rate{}, err
	}
	psn := [2]uint32{rand.Uint32() & (1<<24 - 1), rand.Uint32() & (1<<24 - 1)}
	for i := range 2 {
		j := 1 - i
		gid, _ := tb.devs[j].GID(0)
		if err := verbs.ConnectQP(s.qp[i], verbs.Remote{GID: gid, QPN: s.qp[j].QPN(), PSN: psn[j]}, verbs.PathOptions{SQPSN: psn[i]}); err != nil {
			return rate{}, err
		}
	}
	wrs := make([]verbs.RecvWR, mutexRecvDepth)
	for i := range wrs {
		wrs[i] = s.recvWR(uint64(i))
	}
	if _, err := s.qp[1].PostRecv(wrs); err != nil {
		return rate{}, err
	}

	rx := &counter{}
	var wg sync.WaitGroup
	wg.Go(s.pollSend)
	wg.Go(func() { s.pollRecv(rx) })
	senders := make([]sender, k)
	for i := range senders {
		copy(s.inline[i*len(msg):], msg)
		senders[i] = mutexSender{s: s, buf: s.inline[i*len(msg) : (i+1)*len(msg)]}
	}
	r, err := drive(ctx, senders, k, msg, rx, e.Plan.Warmup, e.Plan.Measure)
	s.stop.Store(true)
	s.mu.Lock()
	s.cond.Broadcast()
	s.mu.Unlock()
	wg.Wait()
	if perr := s.err.Load(); perr != nil && err == nil {
		err = *perr
	}
	return r, err
}

func (s *sharedQP) recvWR(slot uint64) verbs.RecvWR {
	return verbs.RecvWR{WRID: slot, NumSGE: 1, SG: [verbs.MaxSGE]verbs.SGE{{
		Addr: s.mr.Addr() + slot*mutexRecvSize, Length: mutexRecvSize, LKey: s.mr.LKey()}}}
}

// mutexSender is one producer: its message lives in s.inline, a heap
// buffer that stays put while PostSend copies it.
type mutexSender struct {
	s   *sharedQP
	buf []byte
}

var errStopped = errors.New("stopped")

// Send posts one signaled, inline SEND under the QP's mutex, waiting while
// the send queue is full. The message's bytes are the producer's own (the
// argument is only its length: the content is copied at setup).
func (m mutexSender) Send(ctx context.Context, _ []byte) error {
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.posted-s.completed.Load() >= mutexSQDepth {
		if s.stop.Load() || ctx.Err() != nil {
			return errStopped
		}
		s.waiting.Add(1)
		s.cond.Wait()
		s.waiting.Add(-1)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.wr[0] = verbs.SendWR{WRID: s.posted, Opcode: verbs.WRSend, Flags: verbs.SendSignaled | verbs.SendInline, NumSGE: 1,
		SG: [verbs.MaxSGE]verbs.SGE{{Addr: verbs.AddrOf(m.buf), Length: uint32(len(m.buf))}}}
	if _, err := s.qp[0].PostSend(s.wr[:]); err != nil {
		return err
	}
	s.posted++
	return nil
}

// pollSend counts send completions and wakes producers waiting for room.
func (s *sharedQP) pollSend() {
	wcs := make([]verbs.WC, 64)
	for !s.stop.Load() {
		n := poll(s.cq[0], wcs)
		if n == 0 {
			continue
		}
		for i := range n {
			if err := wcs[i].Err(); err != nil {
				s.err.CompareAndSwap(nil, &err)
			}
		}
		s.completed.Add(uint64(n))
		if s.waiting.Load() > 0 {
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}
}

// mutexSpinPolls is how many empty polls a poller of the mutex mode makes,
// yielding, before it sleeps a moment.
const mutexSpinPolls = 2000

// poll returns completions from cq, or 0 after mutexSpinPolls empty polls
// and a 20 µs sleep. A poller that only yields keeps its P from checking
// the runtime's network poller, where the UDP devices' receive loops wait
// (a P checks it when it has nothing else to run, or every 10 ms): the
// baseline ran 12% slower for it, as the engine's pollers once did (see
// engine/poller.go, run). Blocking on the CQ's completion channel instead
// made it slower still: a goroutine blocked in poll(2) holds its P until
// the runtime takes it back.
func poll(cq verbs.CQ, wcs []verbs.WC) int {
	for range mutexSpinPolls {
		if n := cq.Poll(wcs); n > 0 {
			return n
		}
		runtime.Gosched()
	}
	time.Sleep(20 * time.Microsecond)
	return 0
}

// pollRecv counts received messages and reposts their buffers in batches.
func (s *sharedQP) pollRecv(rx *counter) {
	wcs := make([]verbs.WC, 64)
	wrs := make([]verbs.RecvWR, 0, 64)
	for !s.stop.Load() {
		n := poll(s.cq[1], wcs)
		if n == 0 {
			continue
		}
		wrs = wrs[:0]
		for i := range n {
			if err := wcs[i].Err(); err != nil {
				s.err.CompareAndSwap(nil, &err)
				continue
			}
			rx.add(int(wcs[i].ByteLen))
			wrs = append(wrs, s.recvWR(wcs[i].WRID))
		}
		if _, err := s.qp[1].PostRecv(wrs); err != nil {
			s.err.CompareAndSwap(nil, &err)
		}
	}
}

func (s *sharedQP) close() error {
	var errs []error
	for _, q := range s.qp {
		if q != nil {
			errs = append(errs, q.Close())
		}
	}
	if s.mr != nil {
		errs = append(errs, s.mr.Close())
	}
	for _, c := range s.cq {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	for _, p := range s.pd {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

package interop

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// perftest's defaults for its bandwidth tests (perftest_parameters.c), which
// the guest's tools run with: -n and -s are the only flags they are given
// besides the device and the GID index.
const (
	ptIters     = 1000 // -n
	ptTxDepth   = 128  // DEF_TX_BW: sends in flight
	ptRxDepth   = 512  // DEF_RX_SEND: receives posted (at most -n)
	ptCQMod     = 100  // DEF_CQ_MOD: one signaled send in ptCQMod...
	ptCQModSize = 8192 // ...unless messages are larger than this: then all are
	ptMinRNR    = 12   // MIN_RNR_TIMER
	ptTimeout   = 14   // DEF_QP_TIME
)

// ptSizes are the message sizes: one packet at rxe0's 4096-byte MTU, and
// 16. Both are over half perftest's cycle buffer (4096), so it sends,
// writes and receives every message at one address of its buffer (smaller
// ones step through it).
var ptSizes = []int{4096, 65536}

// ptRun is one run of a perftest tool against the soft provider.
type ptRun struct {
	s      *side
	write  bool // ib_write_bw; else ib_send_bw
	client bool // we are the tool's client; else its server
	size   int

	p        *ptConn
	qp       verbs.QP
	scq, rcq verbs.CQ
	mr       verbs.MR
	mine     ptDest
	peer     ptDest
	mtu      verbs.MTU
}

// cqMod is perftest's completion moderation for this size.
func (r *ptRun) cqMod() int {
	if r.size > ptCQModSize {
		return 1
	}
	return ptCQMod
}

func (r *ptRun) run(t *testing.T, ln net.Listener) {
	if sd := r.s.sd; sd != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("soft: %+v", sd.Stats())
			}
		})
	}
	r.dial(t, ln)
	defer r.p.c.Close()
	var err error
	if r.mtu, err = r.p.hello(r.s.dev.Attr().ActiveMTU); err != nil {
		t.Fatal(err)
	}
	r.resources(t)
	r.shake(t) // per QP: the peer's address
	if !r.peer.GID.Addr().Is4() {
		t.Fatalf("perftest's GID %v is not an IPv4 one, as ours (perftest refuses to mix them)", r.peer.GID)
	}
	// perftest's attributes (ctx_modify_qp_to_rtr/rts): its outstanding
	// reads both ways, RNR timer 12, timeout 14, 7 retries, RNR forever.
	access := verbs.AccessRemoteWrite
	if !r.write {
		access |= verbs.AccessLocalWrite
	}
	if err := verbs.ConnectQP(r.qp, verbs.Remote{GID: r.peer.GID, QPN: r.peer.QPN, PSN: r.peer.PSN},
		verbs.PathOptions{MTU: r.mtu, Access: access, SQPSN: r.mine.PSN, Timeout: ptTimeout, RetryCnt: 7, RNRRetry: 7,
			MinRNRTimer: ptMinRNR, MaxRdAtomic: uint8(r.peer.OutReads)}); err != nil {
		t.Fatal(err)
	}
	r.shake(t) // after the QPs moved to RTR/RTS
	r.shake(t) // per QP: printing the peer's address
	t.Logf("soft QPN %#x PSN %#x; perftest QPN %#x PSN %#x GID %v, buffer %#x rkey %#x; MTU %v",
		r.mine.QPN, r.mine.PSN, r.peer.QPN, r.peer.PSN, r.peer.GID, r.peer.VAddr, r.peer.RKey, r.mtu)
	start := time.Now()
	switch {
	case r.write && r.client:
		r.post(t, verbs.WRRDMAWrite)
		r.shake(t)
		r.report(t, start)
	case r.write:
		r.shake(t) // the client's, after its writes
		r.report(t, start)
	case r.client:
		r.shake(t) // the server posted its receives
		r.post(t, verbs.WRSend)
	default:
		r.receive(t) // posts its receives before the handshake
	}
	r.shake(t) // ctx_close_connection
	if err := r.p.done(); err != nil {
		t.Fatal(err)
	}
	if r.write && !r.client {
		r.checkWritten(t)
	}
	verbstest.ExpectIdle(t, r.scq, 0)
	verbstest.ExpectIdle(t, r.rcq, 0)
	t.Logf("%d × %d bytes in %v", ptIters, r.size, time.Since(start))
}

// dial connects to the guest's server, retrying until it listens, or
// takes its client's connection from ln.
func (r *ptRun) dial(t *testing.T, ln net.Listener) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var c net.Conn
	var err error
	if r.client {
		for {
			c, err = net.DialTimeout("tcp", net.JoinHostPort(guestIP(t), fmt.Sprint(ptPort)), 5*time.Second)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	} else {
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		c, err = ln.Accept()
	}
	if err != nil {
		t.Fatalf("perftest exchange: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(3 * time.Minute))
	r.p = &ptConn{c: c, client: r.client}
}

// resources makes what perftest's side would have: one RC QP with
// perftest's queue depths, and a memory region laid out as below.
func (r *ptRun) resources(t *testing.T) {
	s := r.s
	r.scq = verbstest.CreateCQ(t, s.dev, ptTxDepth)
	r.rcq = verbstest.CreateCQ(t, s.dev, ptRxDepth)
	r.qp = verbstest.CreateQP(t, s.pd, verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: r.scq, RecvCQ: r.rcq,
		Cap: verbs.QPCap{MaxSendWR: ptTxDepth, MaxRecvWR: ptRxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	var n int
	acc := verbs.AccessLocalWrite
	switch {
	case r.client:
		n = r.size // what we send or write, from one buffer as perftest does
	case r.write:
		// The window perftest writes into, with a guard of the same size
		// either side that must stay as it was.
		n, acc = 3*r.size, acc|verbs.AccessRemoteWrite
	default:
		// A buffer per receive posted at once, so that every message is
		// checked (perftest's server points them all at one buffer).
		n = min(ptRxDepth, ptIters) * r.size
	}
	r.mr = verbstest.RegMR(t, s.pd, n, acc)
	verbstest.Fill(r.mr.Bytes(), r.guardSeed())
	r.mine = ptDest{OutReads: 1, QPN: r.qp.QPN(), PSN: rand.Uint32() & 0xffffff, RKey: r.mr.RKey(),
		VAddr: r.mr.Addr(), GID: verbstest.GID(t, s.dev)}
	if r.write && !r.client {
		r.mine.VAddr += uint64(r.size)
	}
}

func (r *ptRun) guardSeed() uint64 {
	return seed(fmt.Sprintf("perftest %v %v", r.write, r.client), r.size)
}

// shake is one handshake: the first learns the peer's address, the later
// ones must repeat it.
func (r *ptRun) shake(t *testing.T) {
	t.Helper()
	d, err := r.p.handShake(r.mine)
	if err != nil {
		t.Fatal(err)
	}
	if r.peer.QPN == 0 {
		r.peer = d
	} else if d != r.peer {
		t.Fatalf("perftest handshake: %+v, want its first %+v again", d, r.peer)
	}
}

// post is run_iter_bw: ptIters sends or writes of size bytes from the one
// buffer, at most ptTxDepth in flight, one in cqMod signaled (and the
// last), each signaled one completing as the cqMod before it.
func (r *ptRun) post(t *testing.T, op verbs.WROpcode) {
	t.Helper()
	cqMod := r.cqMod()
	signaled := func(k int) bool { return cqMod == 1 || k%cqMod == cqMod-1 || k == ptIters-1 }
	wcOp := verbs.WCSend
	if op == verbs.WRRDMAWrite {
		wcOp = verbs.WCRDMAWrite
	}
	wcs := make([]verbs.WC, 16)
	posted, retired, next := 0, 0, 0 // next: the signaled WR whose completion comes next
	deadline := time.Now().Add(cqWait)
	for retired < ptIters {
		for posted < ptIters && posted < retired+ptTxDepth {
			w := verbstest.SendWR(uint64(posted), op, verbstest.SGE(r.mr, 0, r.size))
			if !signaled(posted) {
				w.Flags = 0
			}
			if op == verbs.WRRDMAWrite {
				w.RemoteAddr, w.RKey = r.peer.VAddr, r.peer.RKey
			}
			verbstest.MustPostSend(t, r.qp, w)
			posted++
		}
		n := r.scq.Poll(wcs)
		for _, wc := range wcs[:n] {
			for !signaled(next) {
				next++
			}
			if !verbstest.CheckWC(t, wc, verbs.WC{WRID: uint64(next), Status: verbs.WCSuccess, Opcode: wcOp, QPN: r.qp.QPN()}) {
				t.FailNow()
			}
			next++
			retired = next
		}
		if n > 0 {
			deadline = time.Now().Add(cqWait)
		} else if time.Now().After(deadline) {
			t.Fatalf("%d of %d work requests completed, none more within %v", retired, ptIters, cqWait)
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// receive is run_iter_bw_server: as many receives posted as perftest's
// server would (min(ptRxDepth, ptIters)) before the handshake that lets
// the client start, one more per completion until ptIters were posted.
// Every message must be perftest's buffer.
func (r *ptRun) receive(t *testing.T) {
	t.Helper()
	slots := min(ptRxDepth, ptIters)
	slot := func(k int) []byte { o := (k % slots) * r.size; return r.mr.Bytes()[o : o+r.size] }
	postRecv := func(k int) {
		clear(slot(k))
		verbstest.MustPostRecv(t, r.qp, verbstest.RecvWR(uint64(k), verbstest.SGE(r.mr, (k%slots)*r.size, r.size)))
	}
	posted := 0
	for ; posted < slots; posted++ {
		postRecv(posted)
	}
	r.shake(t)
	var want []byte
	wcs := make([]verbs.WC, 16)
	deadline := time.Now().Add(cqWait)
	for got := 0; got < ptIters; {
		n := r.rcq.Poll(wcs)
		for _, wc := range wcs[:n] {
			if !verbstest.CheckWC(t, wc, verbs.WC{WRID: uint64(got), Status: verbs.WCSuccess, Opcode: verbs.WCRecv,
				QPN: r.qp.QPN(), ByteLen: uint32(r.size)}) {
				t.FailNow()
			}
			b := slot(got)
			if want == nil {
				want = r.perftestBuffer(t, b)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("message %d of %d: %v", got, ptIters, diffBytes(b, want))
			}
			got++
			if posted < ptIters {
				postRecv(posted)
				posted++
			}
		}
		if n > 0 {
			deadline = time.Now().Add(cqWait)
		} else if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages received, none more within %v", got, ptIters, cqWait)
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// perftestBuffer returns the size bytes perftest sends or writes from: its
// buffer filled by rand() after srand(time(NULL)), found by the seed whose
// stream starts as got does.
func (r *ptRun) perftestBuffer(t *testing.T, got []byte) []byte {
	t.Helper()
	// The guest's clock is the host's (qemu's RTC); an hour either way
	// is plenty.
	sd, ok := ptSeed(got, time.Now().Unix(), 3600)
	if !ok {
		t.Fatalf("perftest's data % x… is no rand() stream seeded within an hour of now", got[:16])
	}
	t.Logf("perftest's buffer: rand() after srand(%d), %v ago", sd, time.Since(time.Unix(int64(sd), 0)).Round(time.Second))
	return glibcRandBytes(sd, r.size)
}

// report exchanges the bandwidth reports: the client's are what the
// server prints. As the client we send ours (no peak: perftest's server
// prints 0 for it too); as the server we send what we saw, and check the
// client's.
func (r *ptRun) report(t *testing.T, start time.Time) {
	t.Helper()
	el := time.Since(start).Seconds()
	mine := ptReport{Size: uint64(r.size), Iters: ptIters, BWAvg: float64(r.size*ptIters) / el / (1 << 20), MRate: ptIters / el / 1e6}
	theirs, err := r.p.reports(mine)
	if err != nil {
		t.Fatal(err)
	}
	if !r.client && (theirs.Size != uint64(r.size) || theirs.Iters != ptIters || !(theirs.BWAvg > 0)) {
		t.Errorf("perftest's report: %+v; want %d bytes × %d iterations at some bandwidth", theirs, r.size, ptIters)
	}
}

// checkWritten checks our memory region after ib_write_bw's writes: the
// window holds perftest's buffer, the guards either side are untouched.
func (r *ptRun) checkWritten(t *testing.T) {
	t.Helper()
	b := r.mr.Bytes()
	guard := verbstest.Pattern(len(b), r.guardSeed())
	win := b[r.size : 2*r.size]
	if !bytes.Equal(b[:r.size], guard[:r.size]) || !bytes.Equal(b[2*r.size:], guard[2*r.size:]) {
		t.Errorf("ib_write_bw wrote outside the window it was given: before it %v; after it %v",
			diffBytes(b[:r.size], guard[:r.size]), diffBytes(b[2*r.size:], guard[2*r.size:]))
	}
	if bytes.Equal(win, guard[r.size:2*r.size]) {
		t.Fatalf("ib_write_bw's writes never landed: the window is as we left it")
	}
	if want := r.perftestBuffer(t, win); !bytes.Equal(win, want) {
		t.Errorf("the window ib_write_bw wrote: %v", diffBytes(win, want))
	}
}

func diffBytes(got, want []byte) string {
	for i := range got {
		if got[i] != want[i] {
			n := 0
			for j := i; j < len(got); j++ {
				if got[j] != want[j] {
					n++
				}
			}
			return fmt.Sprintf("byte %d is %#02x, want %#02x (%d of %d differ)", i, got[i], want[i], n, len(got))
		}
	}
	return "equal"
}

package verbstest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// backoff spins briefly, then sleeps up to a millisecond, so a waiting test
// leaves the CPU to the provider on a loaded machine.
type backoff struct{ n int }

func (b *backoff) reset() { b.n = 0 }

func (b *backoff) wait() {
	b.n++
	if b.n < 32 {
		runtime.Gosched()
		return
	}
	d := time.Duration(b.n-31) * 20 * time.Microsecond
	time.Sleep(min(d, time.Millisecond))
}

// WaitCQ polls cq until it has returned exactly n completions, and returns
// them in order. It never takes more than n from the CQ. It fails the test,
// listing what it got, if they do not arrive within timeout.
func WaitCQ(t testing.TB, cq verbs.CQ, n int, timeout time.Duration) []verbs.WC {
	t.Helper()
	got := make([]verbs.WC, 0, n)
	buf := make([]verbs.WC, 32)
	deadline := time.Now().Add(timeout)
	var bo backoff
	for len(got) < n {
		k := cq.Poll(buf[:min(len(buf), n-len(got))])
		if k > 0 {
			got = append(got, buf[:k]...)
			bo.reset()
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("CQ: %d of %d completions within %v: %s", len(got), n, timeout, FormatWCs(got))
		}
		bo.wait()
	}
	return got
}

// ExpectIdle fails the test if cq yields a completion within d (one poll
// when d is zero). It consumes what it finds.
func ExpectIdle(t testing.TB, cq verbs.CQ, d time.Duration) {
	t.Helper()
	var got []verbs.WC
	buf := make([]verbs.WC, 16)
	deadline := time.Now().Add(d)
	var bo backoff
	for {
		k := cq.Poll(buf)
		got = append(got, buf[:k]...)
		if !time.Now().Before(deadline) {
			break
		}
		bo.wait()
	}
	if len(got) > 0 {
		t.Errorf("CQ: %d unexpected completions: %s", len(got), FormatWCs(got))
	}
}

// drainCQ returns whatever cq yields within d.
func drainCQ(cq verbs.CQ, d time.Duration) []verbs.WC {
	var got []verbs.WC
	buf := make([]verbs.WC, 16)
	deadline := time.Now().Add(d)
	var bo backoff
	for {
		k := cq.Poll(buf)
		got = append(got, buf[:k]...)
		if !time.Now().Before(deadline) {
			return got
		}
		bo.wait()
	}
}

// WaitState waits until qp reports state want, and fails the test if it
// does not within timeout.
func WaitState(t testing.TB, qp verbs.QP, want verbs.QPState, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := qp.State()
		if s == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QP %#x: state %v after %v, want %v", qp.QPN(), s, timeout, want)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func isRecvOpcode(o verbs.WCOpcode) bool { return o&verbs.WCRecv != 0 }

// CheckWC fails the test unless got matches want, comparing only what
// libibverbs defines for the completion: WRID, Status and QPN always; for a
// success also Opcode and the WCWithImm flag (and ImmData when set), ByteLen
// for receive completions, SrcQP when want names one, and WCWithGRH when want
// has it (RC and UC over RoCE may set it too). An error completion's opcode
// and length are undefined in libibverbs and not compared.
func CheckWC(t testing.TB, got, want verbs.WC) bool {
	t.Helper()
	ok := got.WRID == want.WRID && got.Status == want.Status && got.QPN == want.QPN
	if ok && want.Status == verbs.WCSuccess {
		ok = got.Opcode == want.Opcode &&
			got.Flags&verbs.WCWithImm == want.Flags&verbs.WCWithImm &&
			got.Flags&want.Flags&verbs.WCWithGRH == want.Flags&verbs.WCWithGRH
		if ok && isRecvOpcode(want.Opcode) {
			ok = got.ByteLen == want.ByteLen
		}
		if ok && want.Flags&verbs.WCWithImm != 0 {
			ok = got.ImmData == want.ImmData
		}
		if ok && want.SrcQP != 0 {
			ok = got.SrcQP == want.SrcQP
		}
	}
	if !ok {
		t.Errorf("completion %s\n\twant %s", FormatWC(got), FormatWC(want))
	}
	return ok
}

// CheckWCs checks got against want one by one, in order.
func CheckWCs(t testing.TB, got []verbs.WC, want ...verbs.WC) bool {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%d completions, want %d: %s", len(got), len(want), FormatWCs(got))
		return false
	}
	ok := true
	for i := range got {
		ok = CheckWC(t, got[i], want[i]) && ok
	}
	return ok
}

// FormatWC prints a completion with libibverbs field names.
func FormatWC(wc verbs.WC) string {
	return fmt.Sprintf("{wr_id=%#x status=%q(%d) opcode=%v flags=%#x byte_len=%d imm=%#x qp_num=%#x src_qp=%#x}",
		wc.WRID, wc.Status, uint8(wc.Status), wc.Opcode, uint8(wc.Flags), wc.ByteLen, wc.ImmData, wc.QPN, wc.SrcQP)
}

// FormatWCs prints completions, the first 16 of them in full.
func FormatWCs(wcs []verbs.WC) string {
	if len(wcs) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, wc := range wcs {
		if i == 16 {
			fmt.Fprintf(&b, " … and %d more", len(wcs)-i)
			break
		}
		b.WriteString("\n\t")
		b.WriteString(FormatWC(wc))
	}
	return b.String()
}

// fdReadable reports whether fd becomes readable within d.
func fdReadable(t testing.TB, fd int, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, max(ms, 0))
		if err == unix.EINTR {
			if time.Now().After(deadline) {
				return false
			}
			continue
		}
		if err != nil {
			t.Fatalf("poll(%d): %v", fd, err)
		}
		return n > 0 && fds[0].Revents&unix.POLLIN != 0
	}
}

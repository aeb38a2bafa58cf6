// Package verbstest is the conformance suite every verbs backend must pass,
// and the fixtures (connecting QPs, waiting on CQs, data patterns) that
// provider and engine tests share.
//
// The suite checks that a backend behaves as RDMA hardware driven through
// libibverbs does, so that code above package verbs is tested against what
// hardware does: exact completion status, opcode, byte_len, imm_data, wr_id
// and QPN; byte-exact payloads; the QP state machine and the masks it
// requires; flushing; retry, RNR and access errors; exactly-once in-order
// delivery over a lossy, reordering, duplicating network.
//
// It uses only package verbs. A backend's test wires it up:
//
//	func TestConformance(t *testing.T) { verbstest.Run(t, factory) }
package verbstest

import (
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Options describe the network a Factory must provide.
type Options struct {
	// Per-packet probabilities, in both directions; zero is a perfect network.
	Loss, Duplicate, Reorder float64
	// Seed makes the faults reproducible.
	Seed uint64
}

// Faulty reports whether any fault is asked for.
func (o Options) Faulty() bool { return o.Loss > 0 || o.Duplicate > 0 || o.Reorder > 0 }

// Factory returns n open devices that reach one another, each with one port
// whose RoCEv2 GID at index GIDIndex routes to the others, under opts. It
// registers their cleanup with t.Cleanup; that cleanup must accept devices
// the suite already closed (Close returning ErrClosed). A backend that cannot
// inject faults returns ok=false when opts.Faulty(); the case is then
// reported as not applicable for that backend only. Returning ok=false for a
// perfect network fails the case.
type Factory func(t testing.TB, n int, opts Options) (devs []verbs.Device, ok bool)

// Timing of the suite. Things that must happen are waited for up to waitDone
// (a ceiling for a loaded machine, not an expectation); things that must not
// happen are watched for waitIdle. faultDeadline bounds a fault case's
// traffic: on the kernel's rxe in a TCG guest, 10,000 RC messages at 5% loss
// take 15-25 s, as each lost tail waits out the 34 ms retry timer.
const (
	waitDone      = 5 * time.Second
	waitIdle      = 40 * time.Millisecond
	faultDeadline = 60 * time.Second
	slowCase      = 5 * time.Second
)

type testCase struct {
	name string
	run  func(t *testing.T, f Factory)
}

// cases is the suite, in the order Run runs it.
var cases = []testCase{
	{"PortActive", testPortActive},
	{"RCSendRecv", testRCSendRecv},
	{"RCSendWithImm", testRCSendWithImm},
	{"RCWrite", testRCWrite},
	{"RCWriteWithImm", testRCWriteWithImm},
	{"RCRead", testRCRead},
	{"RCScatterGather", testRCScatterGather},
	{"RCZeroLength", testRCZeroLength},
	{"RCInline", testRCInline},
	{"RC1MiBMTU1024", testRC1MiB(verbs.MTU1024)},
	{"RC1MiBMTU4096", testRC1MiB(verbs.MTU4096)},
	{"Unsignaled", testUnsignaled},
	{"UCSendWrite", testUCSendWrite},
	{"UDSendRecv", testUDSendRecv},
	{"UDRejectsOversize", testUDRejectsOversize},
	{"UDQKeyMismatch", testUDQKeyMismatch},
	{"RCBadRKey", testRCBadRKey},
	{"RCBadLKey", testRCBadLKey},
	{"RecvTooSmall", testRecvTooSmall},
	{"RNRRetrySucceeds", testRNRRetrySucceeds},
	{"RNRRetryExceeded", testRNRRetryExceeded},
	{"RetryExceeded", testRetryExceeded},
	{"StateMachine", testStateMachine},
	{"CreateValidation", testCreateValidation},
	{"PostValidation", testPostValidation},
	{"QueueFull", testQueueFull},
	{"SRQShared", testSRQShared},
	{"CQNotify", testCQNotify},
	{"CloseOrder", testCloseOrder},
	{"RCExactlyOnceUnderFaults", testRCExactlyOnceUnderFaults},
	{"UCLosesWholeMessages", testUCLosesWholeMessages},
	{"MWReadWrite", testMWReadWrite},
	{"MWRefused", testMWRefused},
	{"MWBindErrors", testMWBindErrors},
	{"MWLocalInvErrors", testMWLocalInvErrors},
	{"MWLifetime", testMWLifetime},
	{"RegMRMem", testRegMRMem},
}

// Run runs every case of the suite against the devices f returns, each as a
// subtest named after the case (t.Run("RCSendRecv", ...)). Each case asks f
// for fresh devices, so cases do not share state. Cases run one at a time:
// several of them measure retry and RNR timers.
func Run(t *testing.T, f Factory) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			defer func() {
				if d := time.Since(start); d > slowCase {
					t.Logf("slow case: took %v; every case should take well under %v", d, slowCase)
				}
			}()
			c.run(t, f)
		})
	}
}

// openDevices asks f for n devices, skipping the case only when the backend
// cannot inject the faults asked for.
func openDevices(t *testing.T, f Factory, n int, opts Options) []verbs.Device {
	t.Helper()
	devs, ok := f(t, n, opts)
	if !ok {
		if opts.Faulty() {
			t.Skipf("not applicable: this backend cannot inject faults (loss %g, duplicate %g, reorder %g)",
				opts.Loss, opts.Duplicate, opts.Reorder)
		}
		t.Fatalf("factory refused %d devices on a perfect network", n)
	}
	if len(devs) != n {
		t.Fatalf("factory returned %d devices, want %d", len(devs), n)
	}
	for i, d := range devs {
		if d == nil {
			t.Fatalf("factory returned a nil device at %d", i)
		}
	}
	return devs
}

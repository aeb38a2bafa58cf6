package shm

import (
	"runtime"
	"time"
)

// Spin is how long an idle ring is polled (yielding the processor between
// looks) before its waiter sleeps on the doorbell: a reply that comes
// within it costs no system call on either side, and an idle vconn burns
// no core after it. Only with spinMinProcs Ps or more: see SpinFor.
const Spin = 50 * time.Microsecond

// spinMinProcs is the fewest Ps with which waits spin at all. A spinner
// yields with runtime.Gosched, which puts it straight back on the run
// queue: a P that always has it to run never looks at the network
// poller, where the other side's doorbell wakes its sleeper (and, in the
// agent, the engine's UDP device receives). With two Ps, a handful of
// spinners (each side of each vconn, in one process in tests) kept both
// Ps from it for most of each 50 µs window, and the replies they spun
// for took longer than that anyway. With more Ps, one is idle and waits
// in the poller.
const spinMinProcs = 4

// SpinFor is how long a wait, the agent's or the pod's, spins before it
// sleeps: Spin, or none with too few Ps.
func SpinFor() time.Duration {
	if runtime.GOMAXPROCS(0) < spinMinProcs {
		return 0
	}
	return Spin
}

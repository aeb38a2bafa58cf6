package engine

import (
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestSpuriousTimeouts: a path that has lost nothing waits out a stall of
// its acknowledgements longer than LossyMinRTO and shorter than MinRTO
// (what a poller waiting for a core on a busy node costs) without
// resending anything (on the old 5 ms floor it resent 2 of the 5). A
// path whose peer reported a gap within LossyHold keeps the 5 ms floor
// (reliable.TestSenderRTT).
func TestSpuriousTimeouts(t *testing.T) {
	ctx, a, _, va, vb, fb := testPairOnFabric(t, transport.Auto, 30*time.Second)
	if fb == nil {
		return // on a NIC (the rxe guests), nothing here can stall its path
	}
	size := func(int) int { return 64 }
	// Samples of a fast path first: the estimate is microseconds.
	go sendNumbered(ctx, t, va, 100, size)
	recvNumbered(ctx, t, vb, 100, size)
	time.Sleep(20 * reliable.AckDelay)
	before := a.Stats()
	// Every packet now takes 6 ms each way: acknowledgements come 12 ms
	// after their datagram, past the lossy floor, within MinRTO.
	const stall = 6 * time.Millisecond
	fb.SetFaults(softwire.Faults{Delay: stall})
	for range 5 {
		go sendNumbered(ctx, t, va, 1, size)
		recvNumbered(ctx, t, vb, 1, size)
	}
	time.Sleep(4 * stall)
	fb.SetFaults(softwire.Faults{})
	after := a.Stats()
	if rtx := after.Retransmits - before.Retransmits; rtx != 0 && !raceEnabled {
		t.Errorf("%d datagrams resent on a lossless path whose acknowledgements took %s: want none (the floor is %s while the peer reports no gap)",
			rtx, 2*stall, reliable.MinRTO)
	}
}

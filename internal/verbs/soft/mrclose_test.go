package soft

import (
	"runtime"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestMRCloseRacesRemoteAccess deregisters a region while the peer writes
// and reads it with RDMA, as a close racing a peer (or a host forging
// packets with a leaked key) would: the process must not fault on the
// unmapped memory. The peer's operations end in a remote access error,
// as on a NIC.
func TestMRCloseRacesRemoteAccess(t *testing.T) {
	for round := range 20 {
		fb := wire.NewFabric(wire.Faults{})
		p := newRCPair(t, fb, verbs.MTU4096)
		target, err := p.qb.(*qp).pd.RegMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan verbs.WCStatus, 1)
		go func() {
			wc := make([]verbs.WC, 16)
			posted, completed := 0, 0
			for {
				select {
				case <-stop:
					done <- verbs.WCSuccess
					return
				default:
				}
				for posted-completed < 64 {
					op := verbs.WRRDMAWrite
					if posted%2 == 1 {
						op = verbs.WRRDMARead
					}
					wr := verbs.SendWR{WRID: uint64(posted), Opcode: op, Flags: verbs.SendSignaled, NumSGE: 1,
						SG: sge(p.mra, uint64(posted%16)*64<<10, 64<<10), RemoteAddr: target.Addr() + uint64(posted%16)*64<<10, RKey: target.RKey()}
					if _, err := p.qa.PostSend([]verbs.SendWR{wr}); err != nil {
						done <- verbs.WCGeneralErr
						return
					}
					posted++
				}
				n := p.cqa.Poll(wc)
				for _, c := range wc[:n] {
					completed++
					if c.Status != verbs.WCSuccess {
						done <- c.Status
						return
					}
				}
				runtime.Gosched()
			}
		}()
		time.Sleep(time.Duration(1+round%5) * time.Millisecond)
		if err := target.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case st := <-done:
			if st != verbs.WCRemAccessErr {
				t.Fatalf("round %d: the peer's operations ended with %v, want a remote access error", round, st)
			}
		case <-time.After(20 * time.Second):
			close(stop)
			t.Fatalf("round %d: the peer's operations never failed after the close", round)
		}
	}
}

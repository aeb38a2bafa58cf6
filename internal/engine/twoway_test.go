package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestBothEndsStalledOnCredits: both ends of a vconn send at once, faster
// than a small credit window lets through, while both read everything. A
// grant an end owes usually rides on its next data, but when that data
// itself waits for the peer's grant, the grant must go alone: otherwise
// each end waits for the other's grant forever, with both readers idle.
// (pkg/vconn's shared-memory echo hung this way about once in 15 runs.)
func TestBothEndsStalledOnCredits(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{Credits: 2, MaxCredits: 2})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			const n = 2000
			size := func(i int) int { return 1 + (i*7919)%40000 } // one to three chunks
			var wg sync.WaitGroup
			for _, vc := range []*VConn{va, vb} {
				wg.Add(2)
				go func() { defer wg.Done(); sendNumbered(ctx, t, vc, n, size) }()
				go func() {
					defer wg.Done()
					for i := range n {
						m, err := vc.Recv(ctx)
						if err != nil {
							t.Errorf("%v: message %d of %d: %v", vc.ID(), i, n, err)
							return
						}
						if m.Imm != uint32(i) || len(m.Data) != size(i) || m.Data[len(m.Data)-1] != byte(i) {
							t.Errorf("%v: message %d arrived as imm %d with %d bytes", vc.ID(), i, m.Imm, len(m.Data))
						}
						m.Release()
					}
				}()
			}
			wg.Wait()
		})
	}
}

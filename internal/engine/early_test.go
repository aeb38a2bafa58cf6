package engine

import (
	"context"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestFirstMessageBeforeConnect: the accepting side may send as soon as
// it is connected, and its message may reach the dialling side before the
// dial's answer does (Connect): it is delivered once the dialler connects.
// Before, the dialler, not knowing yet which of the peer's QPs the peer's
// vconn sends on, took it for a message on a wrong QP and dropped it
// (RejectPeer) though the peer's RC QP had delivered it: the vconn's first
// message was lost for good whenever the peer's vconn sent on a QP of
// another index than 0 (pkg/vconn's TestSharedMemoryHostilePod saw it).
func TestFirstMessageBeforeConnect(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEngines(t, wire.Faults{}, Config{QPsPerPeer: 2})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			pa, err := a.Peer(b.gid, LocalLink{To: b})
			if err != nil {
				t.Fatal(err)
			}
			pb, err := b.Peer(a.gid, LocalLink{To: a})
			if err != nil {
				t.Fatal(err)
			}
			va, err := a.NewVConn(ctx, pa, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			// The accepting side's vconn on a QP of index 1 (of 2): an odd vQPN.
			var vb *VConn
			for vb == nil || vb.ID().VQPN()%2 == 0 {
				if vb, err = b.NewVConn(ctx, pb, VConnOptions{Transport: tr}); err != nil {
					t.Fatal(err)
				}
			}
			if err := vb.Connect(va.ID()); err != nil {
				t.Fatal(err)
			}
			msgs := []string{"first", "second"}
			for _, m := range msgs {
				if err := vb.Send(ctx, []byte(m)); err != nil {
					t.Fatal(err)
				}
			}
			// Until the messages reached a's engine, before a knows vb.
			deadline := time.Now().Add(5 * time.Second)
			for a.Stats().MsgsReceived+a.RejectStats()[RejectPeer] < uint64(len(msgs)) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if err := va.Connect(vb.ID()); err != nil {
				t.Fatal(err)
			}
			for _, want := range msgs {
				rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
				m, err := va.Recv(rctx)
				rcancel()
				if err != nil {
					t.Fatalf("recv %q: %v (rejected as from a wrong QP: %d)", want, err, a.RejectStats()[RejectPeer])
				}
				if string(m.Data) != want {
					t.Fatalf("got %q, want %q", m.Data, want)
				}
				m.Release()
			}
			// And the vconn carries on both ways.
			if err := va.Send(ctx, []byte("back")); err != nil {
				t.Fatal(err)
			}
			m, err := vb.Recv(ctx)
			if err != nil || string(m.Data) != "back" {
				t.Fatalf("reply: %q, %v", m.Data, err)
			}
			m.Release()
		})
	}
}

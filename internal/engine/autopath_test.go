package engine

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestAutoPathSwitch: an Auto vconn's small messages move to RC while the
// network loses packets and back to UC datagrams once it stops
// (reliable.Path), and the stream stays whole and in order across both
// switches: datagrams, probes and RC messages share the vconn's one
// sequence, which the receiver delivers in order whatever QP each took.
// The policy's thresholds are lowered so that 3% loss, which the soft
// fabric's RC survives, is enough to switch.
func TestAutoPathSwitch(t *testing.T) {
	fb := softwire.NewFabric(softwire.Faults{Seed: 9, Loss: 0.03})
	t.Cleanup(func() { _ = fb.Close() })
	a, b := testEnginesOn(t, fb, Config{})
	a.pathPolicy = reliable.PathPolicy{Window: 32, HighLoss: 0.02, LowLoss: 0.01, HoldWindows: 2, HoldRTTs: 4, ProbeEvery: 4}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: transport.Auto}, VConnOptions{Transport: transport.Auto})
	if err != nil {
		t.Fatal(err)
	}
	size := func(i int) int { return 8 + i%300 }
	var sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	// A failing receiver ends the context, and the sender with it,
	// before the test returns.
	defer func() { cancel(); <-done }()
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := va.SendImm(ctx, bytes.Repeat([]byte{byte(i)}, size(i)), uint32(i)); err != nil {
				if ctx.Err() == nil {
					t.Error(err)
				}
				return
			}
			sent.Add(1)
		}
	}()
	// The receiver checks every message as it comes, while the loss
	// phase runs until the path moved to RC and the clean one until it
	// moved back.
	recvd := 0
	recv := func(until func() bool) {
		t.Helper()
		for !until() {
			m, err := vb.Recv(ctx)
			if err != nil {
				s := a.Stats()
				t.Fatalf("message %d: %v (%d retransmissions, %d moves to RC, %d back)", recvd, err, s.Retransmits, s.AutoToRC, s.AutoToUC)
			}
			if m.Imm != uint32(recvd) || len(m.Data) != size(recvd) || m.Data[0] != byte(recvd) || m.Data[len(m.Data)-1] != byte(recvd) {
				t.Fatalf("message %d arrived as imm %d with %d bytes", recvd, m.Imm, len(m.Data))
			}
			m.Release()
			recvd++
		}
	}
	recv(func() bool { return a.Stats().AutoToRC > 0 && recvd > 1000 })
	fb.SetFaults(softwire.Faults{})
	recv(func() bool { return a.Stats().AutoToUC > 0 && recvd > 2000 })
	// The sender may be parked for credits that only this reader's
	// releases give back: read on until it stopped and all it sent came
	// (waiting for it first deadlocked, 1 run in about 50 under two CPU
	// burners, until the test's deadline).
	close(stop)
	for stopped := false; !stopped || int64(recvd) < sent.Load(); {
		if int64(recvd) == sent.Load() {
			select {
			case <-done:
				stopped = true // sent is final
			case <-time.After(time.Millisecond):
			}
			continue
		}
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d of %d: %v", recvd, sent.Load(), err)
		}
		if m.Imm != uint32(recvd) {
			t.Fatalf("message %d arrived as imm %d", recvd, m.Imm)
		}
		m.Release()
		recvd++
	}
	s := a.Stats()
	t.Logf("%d messages in order; %d retransmissions; %d moves to RC, %d back", recvd, s.Retransmits, s.AutoToRC, s.AutoToUC)
	closeAll(t, a, b, va, vb)
}

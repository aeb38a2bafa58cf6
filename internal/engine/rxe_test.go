//go:build ibverbs && linux

package engine

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/ibv"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// In hack/rxe-vm (RDMAVISOR_RXE_VM=1; hack/rxe-vm/engine.sh) the tests
// that take a fault-free pair of engines (testEngines) run them on the
// kernel's rxe0 through libibverbs, named by RDMAVISOR_IBV_DEVICE (default
// rxe0). Both engines open the same device: rxe delivers between its own
// QPs, RC, UC and UD alike, so the pair talks as two nodes would. The
// tests that inject faults (testEnginesOn with a fabric whose faults they
// set, or a wrapped device) stay on the soft provider: rxe has no loss,
// duplication or reordering to ask for.
func init() {
	if os.Getenv("RDMAVISOR_RXE_VM") != "1" {
		return
	}
	name := os.Getenv("RDMAVISOR_IBV_DEVICE")
	if name == "" {
		name = "rxe0"
	}
	openVerbsDevice = func(t testing.TB) verbs.Device {
		t.Helper()
		d, err := ibv.Open(ibv.Config{Names: []string{name}})
		if err != nil {
			t.Fatalf("open %s: %v", name, err)
		}
		return d
	}
}

// TestEnginesOnRxe: in the rxe VM, testEngines gives engines on rxe0, not
// on the soft provider; a vconn over each transport carries a message.
func TestEnginesOnRxe(t *testing.T) {
	if os.Getenv("RDMAVISOR_RXE_VM") != "1" {
		t.Skip("needs the kernel's rxe: hack/rxe-vm/engine.sh runs this with RDMAVISOR_RXE_VM=1")
	}
	a, b := testEngines(t, wire.Faults{}, Config{})
	for _, e := range []*Engine{a, b} {
		if got := e.cfg.Device.Attr().Name; got == "" || got == "10.9.0.1" || got == "10.9.0.2" {
			t.Fatalf("engine on device %q, want the rxe device", got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
		va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
		if err != nil {
			t.Fatalf("%v: %v", tr, err)
		}
		if err := va.Send(ctx, []byte("over rxe")); err != nil {
			t.Fatalf("%v: send: %v", tr, err)
		}
		m, err := vb.Recv(ctx)
		if err != nil || string(m.Data) != "over rxe" {
			t.Fatalf("%v: recv %q, %v", tr, m.Data, err)
		}
		m.Release()
		_ = va.Close()
		_ = vb.Close()
	}
}

package soft

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

func faultsOf(o verbstest.Options) wire.Faults {
	return wire.Faults{Seed: o.Seed, Loss: o.Loss, Duplicate: o.Duplicate, Reorder: o.Reorder}
}

func openOn(t testing.TB, w wire.Wire, i int) verbs.Device {
	d, err := Open(Config{Name: fmt.Sprintf("soft%d", i), Wire: w})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("close device: %v", err)
		}
	})
	return d
}

// TestConformanceFabric runs the verbs conformance suite on the in-memory
// fabric.
func TestConformanceFabric(t *testing.T) {
	verbstest.Run(t, func(t testing.TB, n int, o verbstest.Options) ([]verbs.Device, bool) {
		fb := wire.NewFabric(faultsOf(o))
		t.Cleanup(func() { _ = fb.Close() })
		devs := make([]verbs.Device, n)
		for i := range devs {
			w, err := fb.Attach(verbs.GIDFromAddr(netip.AddrFrom4([4]byte{10, 2, 0, byte(1 + i)})))
			if err != nil {
				t.Fatal(err)
			}
			devs[i] = openOn(t, w, i)
		}
		return devs, true
	})
}

// TestConformanceUDP runs the suite over real UDP sockets on loopback, with
// faults injected on the sending side when a case asks for them.
func TestConformanceUDP(t *testing.T) {
	verbstest.Run(t, func(t testing.TB, n int, o verbstest.Options) ([]verbs.Device, bool) {
		port := freeUDPPort(t)
		f := faultsOf(o)
		devs := make([]verbs.Device, n)
		for i := range devs {
			u, err := wire.ListenUDP(wire.UDPConfig{Addr: netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)}), Port: port})
			if err != nil {
				t.Fatal(err)
			}
			var w wire.Wire = u
			if f != (wire.Faults{}) {
				w = wire.WithFaults(u, f)
			}
			d, err := Open(Config{Name: fmt.Sprintf("soft%d", i), Wire: w, Port: port})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := d.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
					t.Errorf("close device: %v", err)
				}
			})
			devs[i] = d
		}
		return devs, true
	})
}

package engine

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// TestInfiniBandPort: on ports whose link layer is InfiniBand the engine
// builds only LID-routed paths and address handles (no GRH; the fake
// subnet refuses a GRH), each side learns the other's LID over ConnectQP,
// datagrams are admitted by their source LID, and every transport carries
// messages both ways.
func TestInfiniBandPort(t *testing.T) {
	sub := verbstest.NewSubnet()
	lids := []uint16{0x11, 0x2a}
	next := 0
	attach := func(d verbs.Device) verbs.Device {
		ib, err := sub.Attach(d, lids[next])
		if err != nil {
			t.Fatal(err)
		}
		next++
		return ib
	}
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	a, b := testEnginesOn(t, fb, Config{}, attach)
	for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range []int{0, 1, 200, va.MaxMessage()} {
				msg := bytes.Repeat([]byte{byte(i + 1)}, n)
				if err := va.SendImm(ctx, msg, uint32(i)); err != nil {
					t.Fatal(err)
				}
				m, err := vb.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(m.Data, msg) || m.Imm != uint32(i) {
					t.Fatalf("message %d: %d bytes, imm %d", i, len(m.Data), m.Imm)
				}
				m.Release()
			}
			if err := vb.Send(ctx, []byte("pong")); err != nil {
				t.Fatal(err)
			}
			if m, err := va.Recv(ctx); err != nil || string(m.Data) != "pong" {
				t.Fatalf("reply: %q %v", m.Data, err)
			}
			_ = va.Close()
			_ = vb.Close()
		})
	}
	seen := map[uint16]bool{}
	avs := sub.Vectors()
	for _, av := range avs {
		if !av.NoGRH || av.DGID != (verbs.GID{}) {
			t.Errorf("vector %+v: want LID-routed, without a GRH or DGID", av)
		}
		seen[av.DLID] = true
	}
	// RC and UC paths both ways, and the UD address handles.
	if len(avs) < 4 || len(seen) != 2 || !seen[lids[0]] || !seen[lids[1]] {
		t.Errorf("vectors %+v: want paths to both LIDs %#x", avs, lids)
	}
}

// TestInfiniBandPortWithoutLID: an InfiniBand port with no LID (no subnet
// manager assigned one) cannot route, and the engine says so at start.
func TestInfiniBandPortWithoutLID(t *testing.T) {
	fb := softwire.NewFabric(softwire.Faults{})
	t.Cleanup(func() { _ = fb.Close() })
	w, err := fb.Attach(verbs.GIDFromAddr(netip.MustParseAddr("10.9.0.7")))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := soft.Open(soft.Config{Name: "10.9.0.7", Wire: w})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	_, err = New(Config{Device: noLID{dev}})
	if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "subnet manager") {
		t.Fatalf("New on an InfiniBand port without a LID: %v; want ErrInvalid naming the subnet manager", err)
	}
}

// noLID is an InfiniBand port whose LID is unassigned.
type noLID struct{ verbs.Device }

func (d noLID) Attr() verbs.DeviceAttr {
	a := d.Device.Attr()
	a.LinkLayer, a.LID = verbs.LinkLayerInfiniBand, 0
	return a
}

package engine

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// hookDevice runs hook on every batch of completions its CQs return, as a
// device that reports them otherwise would.
type hookDevice struct {
	verbs.Device
	hook func(wcs []verbs.WC)
}

type hookCQ struct {
	verbs.CQ
	hook func(wcs []verbs.WC)
}

// hookPD hands the device its own CQs when QPs are created.
type hookPD struct{ verbs.PD }

func (d hookDevice) CreateCQ(n int) (verbs.CQ, error) {
	cq, err := d.Device.CreateCQ(n)
	if err != nil {
		return nil, err
	}
	return hookCQ{cq, d.hook}, nil
}

func (d hookDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return hookPD{pd}, nil
}

func (pd hookPD) CreateQP(attr *verbs.QPInitAttr) (verbs.QP, error) {
	a := *attr
	for _, cq := range []*verbs.CQ{&a.SendCQ, &a.RecvCQ} {
		if c, ok := (*cq).(hookCQ); ok {
			*cq = c.CQ
		}
	}
	return pd.PD.CreateQP(&a)
}

func (c hookCQ) Poll(wcs []verbs.WC) int {
	n := c.CQ.Poll(wcs)
	c.hook(wcs[:n])
	return n
}

// grhDevice flags every receive completion WCWithGRH, as a NIC may for RC
// and UC over RoCE (libibverbs leaves it to the device), where the soft
// provider flags only UD's.
func grhDevice(d verbs.Device) verbs.Device {
	return hookDevice{d, func(wcs []verbs.WC) {
		for i := range wcs {
			if wcs[i].Opcode&verbs.WCRecv != 0 {
				wcs[i].Flags |= verbs.WCWithGRH
			}
		}
	}}
}

// exchange sends n messages from va to vb, msg(i) each, and checks each
// arrives whole and in order.
func exchange(ctx context.Context, t *testing.T, va, vb *VConn, n int, msg func(i int) []byte) {
	t.Helper()
	for i := range n {
		want := msg(i)
		if err := va.Send(ctx, want); err != nil {
			t.Fatal(err)
		}
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(m.Data, want) {
			t.Fatalf("message %d: got %q, want %q", i, m.Data, want)
		}
		m.Release()
	}
}

// Only a UD receive holds a GRH in its buffer: on every transport, a
// receive the device flags WCWithGRH is delivered whole.
func TestGRHFlagOnEveryReceive(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEnginesOn(t, wire.NewFabric(wire.Faults{}), Config{}, grhDevice)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			exchange(ctx, t, va, vb, 20, func(i int) []byte {
				return []byte(fmt.Sprintf("message %d over %v, long enough to be more than a GRH: %040d", i, tr, i))
			})
		})
	}
}

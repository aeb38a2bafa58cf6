package engine

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// grhDevice flags every receive completion WCWithGRH, as a NIC may for RC
// and UC over RoCE (libibverbs leaves it to the device), where the soft
// provider flags only UD's.
type grhDevice struct{ verbs.Device }

type grhCQ struct{ verbs.CQ }

func (d grhDevice) CreateCQ(n int) (verbs.CQ, error) {
	cq, err := d.Device.CreateCQ(n)
	if err != nil {
		return nil, err
	}
	return grhCQ{cq}, nil
}

// grhPD hands the device its own CQs when QPs are created.
type grhPD struct{ verbs.PD }

func (d grhDevice) AllocPD() (verbs.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return grhPD{pd}, nil
}

func (pd grhPD) CreateQP(attr *verbs.QPInitAttr) (verbs.QP, error) {
	a := *attr
	for _, cq := range []*verbs.CQ{&a.SendCQ, &a.RecvCQ} {
		if g, ok := (*cq).(grhCQ); ok {
			*cq = g.CQ
		}
	}
	return pd.PD.CreateQP(&a)
}

func (c grhCQ) Poll(wcs []verbs.WC) int {
	n := c.CQ.Poll(wcs)
	for i := range wcs[:n] {
		if wcs[i].Opcode&verbs.WCRecv != 0 {
			wcs[i].Flags |= verbs.WCWithGRH
		}
	}
	return n
}

// Only a UD receive holds a GRH in its buffer: on every transport, a
// receive the device flags WCWithGRH is delivered whole.
func TestGRHFlagOnEveryReceive(t *testing.T) {
	for _, tr := range []Transport{RC, UC, UD, Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			a, b := testEnginesOn(t, wire.NewFabric(wire.Faults{}), Config{}, func(d verbs.Device) verbs.Device { return grhDevice{d} })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				want := []byte(fmt.Sprintf("message %d over %v, long enough to be more than a GRH: %040d", i, tr, i))
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
		})
	}
}

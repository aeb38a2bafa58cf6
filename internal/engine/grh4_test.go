package engine

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// roce4Device writes a UD receive's GRH space as the kernel does for RoCE
// v2 over IPv4 (rxe and mlx5 alike): 20 bytes of zeros, then the packet's
// IPv4 header. The soft provider now writes that layout itself; the
// wrapper keeps the test independent of it. The engine it serves is set
// once New returns; the hook rewrites the receive buffers in its pool.
func roce4Device(d verbs.Device, ep *atomic.Pointer[Engine]) verbs.Device {
	return hookDevice{d, func(wcs []verbs.WC) {
		e := ep.Load()
		for i := range wcs {
			wc := &wcs[i]
			if e == nil || wc.Opcode != verbs.WCRecv || wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithGRH == 0 {
				continue
			}
			b := e.pool.bytes(recvSlot(wc.WRID))
			if b[0] != 0x60 { // not a UD receive: RC and UC put no GRH in the buffer
				continue
			}
			src := [4]byte(verbs.GID(b[8:24]).Addr().As4())
			dst := [4]byte(verbs.GID(b[24:40]).Addr().As4())
			clear(b[:verbs.GRHSize])
			ip := b[20:40]
			ip[0] = 0x45 // IPv4, 20-byte header
			ip[8] = 64   // TTL
			ip[9] = 17   // UDP
			copy(ip[12:16], src[:])
			copy(ip[16:20], dst[:])
		}
	}}
}

// A datagram over RoCE v2 on IPv4 carries the IPv4 header, not a GRH, in
// the receive's GRH space: the engine finds the sender there. Reading the
// source GID at bytes 8-23 (zeros and the IP header's first bytes) drops
// every datagram as from a stranger: UD and Auto vconns on rxe timed out.
func TestUDOverIPv4RoCE(t *testing.T) {
	for _, tr := range []transport.Kind{transport.UD, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			var pa, pb atomic.Pointer[Engine]
			fb := wire.NewFabric(wire.Faults{})
			t.Cleanup(func() { _ = fb.Close() })
			ptrs := []*atomic.Pointer[Engine]{&pa, &pb}
			k := 0
			a, b := testEnginesOn(t, fb, Config{}, func(d verbs.Device) verbs.Device {
				k++
				return roce4Device(d, ptrs[k-1])
			})
			pa.Store(a)
			pb.Store(b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			exchange(ctx, t, va, vb, 20, func(i int) []byte { return []byte(fmt.Sprintf("datagram %d over %v", i, tr)) })
		})
	}
}

// grhSource reads both layouts of the GRH space.
func TestGRHSource(t *testing.T) {
	v4 := verbs.GIDFromAddr(netip.MustParseAddr("10.99.0.2"))
	v6 := verbs.GIDFromAddr(netip.MustParseAddr("fd00::7"))
	var grh6, grh4 [verbs.GRHSize]byte
	grh6[0] = 0x60
	copy(grh6[8:24], v6[:])
	grh4[20] = 0x45
	copy(grh4[32:36], []byte{10, 99, 0, 2})
	for name, c := range map[string]struct {
		grh  []byte
		want verbs.GID
	}{"GRH": {grh6[:], v6}, "IPv4 header": {grh4[:], v4}} {
		if got := grhSource(c.grh); got != c.want {
			t.Errorf("%s: %v, want %v", name, got, c.want)
		}
	}
}

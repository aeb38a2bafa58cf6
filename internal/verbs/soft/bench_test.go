package soft

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// benchSizes are the message sizes of the RC-vs-TCP comparison that
// `make bench` reports as ratios.
var benchSizes = []int{64, 4 << 10, 64 << 10}

// freeUDPPort returns a UDP port free on both loopback addresses.
func freeUDPPort(t testing.TB) uint16 {
	t.Helper()
	for range 20 {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
		if err != nil {
			t.Fatal(err)
		}
		port := c.LocalAddr().(*net.UDPAddr).Port
		c2, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3), Port: port})
		c.Close()
		if err == nil {
			c2.Close()
			return uint16(port)
		}
	}
	t.Fatal("no free UDP port on 127.0.0.2 and 127.0.0.3")
	return 0
}

// udpDevices opens n soft devices on 127.0.0.2, 127.0.0.3, ... sharing a port.
func udpDevices(t testing.TB, n int) []*Device {
	t.Helper()
	port := freeUDPPort(t)
	devs := make([]*Device, n)
	for i := range devs {
		w, err := wire.ListenUDP(wire.UDPConfig{Addr: netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)}), Port: port})
		if err != nil {
			t.Fatal(err)
		}
		d, err := Open(Config{Name: fmt.Sprintf("soft%d", i), Wire: w})
		if err != nil {
			t.Fatal(err)
		}
		devs[i] = d
	}
	return devs
}

func newRCPairOn(t testing.TB, da, db *Device, mtu verbs.MTU) *rcPair {
	p := &rcPair{da: da, db: db}
	side := func(d *Device) (verbs.CQ, verbs.QP, verbs.MR) {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(8192)
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 2048, MaxRecvWR: 2048, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(8<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = qp.Close()
			_ = mr.Close()
			_ = cq.Close()
			_ = pd.Close()
			_ = d.Close()
		})
		return cq, qp, mr
	}
	p.cqa, p.qa, p.mra = side(da)
	p.cqb, p.qb, p.mrb = side(db)
	connectRC(t, p.qa, p.qb.QPN(), db.gid, mtu)
	connectRC(t, p.qb, p.qa.QPN(), da.gid, mtu)
	return p
}

// streamSends pushes n messages of size bytes from a to b over RC SEND,
// keeping window messages in flight, and returns when b has all of them.
func streamSends(t testing.TB, p *rcPair, n, size, window int) {
	recvs := make([]verbs.RecvWR, window)
	slots := (8 << 20) / size
	for i := range recvs {
		off := uint64(i%slots) * uint64(size)
		recvs[i] = verbs.RecvWR{WRID: uint64(i), NumSGE: 1, SG: sge(p.mrb, off, uint32(size))}
	}
	if _, err := p.qb.PostRecv(recvs); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		wcs := make([]verbs.WC, min(64, window))
		got := 0
		for got < n {
			k := p.cqb.Poll(wcs)
			if k == 0 {
				runtime.Gosched()
				continue
			}
			for i := 0; i < k; i++ {
				if wcs[i].Status != verbs.WCSuccess || wcs[i].ByteLen != uint32(size) {
					done <- fmt.Errorf("receive completion %+v", wcs[i])
					return
				}
				recvs[i] = verbs.RecvWR{WRID: wcs[i].WRID, NumSGE: 1, SG: sge(p.mrb, uint64(int(wcs[i].WRID)%slots)*uint64(size), uint32(size))}
			}
			got += k
			if _, err := p.qb.PostRecv(recvs[:k]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	wrs := make([]verbs.SendWR, 32)
	for i := range wrs {
		wrs[i] = verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, uint32(size))}
	}
	wcs := make([]verbs.WC, 64)
	posted, completed := 0, 0
	for completed < n {
		if k := min(len(wrs), n-posted, window-(posted-completed)); k > 0 {
			if _, err := p.qa.PostSend(wrs[:k]); err != nil {
				t.Fatal(err)
			}
			posted += k
		}
		k := p.cqa.Poll(wcs)
		for i := 0; i < k; i++ {
			if wcs[i].Status != verbs.WCSuccess {
				t.Fatalf("send completion %+v", wcs[i])
			}
		}
		completed += k
		if k == 0 {
			runtime.Gosched()
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRCUDP is RC SEND throughput between two soft devices over UDP
// loopback (path MTU 4096).
func BenchmarkRCUDP(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			devs := udpDevices(b, 2)
			p := newRCPairOn(b, devs[0], devs[1], verbs.MTU4096)
			window := max(4, min(512, (1<<20)/size))
			streamSends(b, p, 200, size, window) // warm up
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			streamSends(b, p, b.N, size, window)
			b.StopTimer()
			st := devs[0].Stats()
			b.ReportMetric(float64(st.Retransmits)/float64(b.N), "retransmits/msg")
		})
	}
}

// BenchmarkTCPLoopback is the baseline: the same messages over a TCP
// connection on loopback, read whole by the receiver.
func BenchmarkTCPLoopback(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				buf := make([]byte, size)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						if err == io.EOF {
							err = nil
						}
						done <- err
						return
					}
				}
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			msg := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
			}
			c.Close()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkRCFabric is RC SEND throughput on the in-memory fabric: the
// provider's own cost without the kernel.
func BenchmarkRCFabric(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			p := newRCPair(b, wire.NewFabric(wire.Faults{}), verbs.MTU4096)
			window := max(4, min(512, (1<<20)/size))
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			streamSends(b, p, b.N, size, window)
		})
	}
}

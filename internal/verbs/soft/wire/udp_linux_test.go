package wire

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

var (
	addr2 = netip.MustParseAddr("127.0.0.2")
	addr3 = netip.MustParseAddr("127.0.0.3")
)

// freePort finds a UDP port free on 127.0.0.2 (and, in practice, on the
// other loopback addresses): every device of a network uses the same port.
func freePort(t testing.TB) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// udpPair opens wires on two addresses sharing one port.
func udpPair(t testing.TB, cfg UDPConfig, a1, a2 netip.Addr) (*UDP, *UDP) {
	t.Helper()
	if cfg.Port == 0 {
		cfg.Port = freePort(t)
	}
	cfg.Addr = a1
	u1, err := ListenUDP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = a2
	u2, err := ListenUDP(cfg)
	if err != nil {
		u1.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { u1.Close(); u2.Close() })
	return u1, u2
}

// offloads runs f with UDP offload on and off.
func offloads(t *testing.T, f func(t *testing.T, cfg UDPConfig)) {
	for _, off := range []bool{false, true} {
		t.Run(fmt.Sprintf("nooffload=%v", off), func(t *testing.T) { f(t, UDPConfig{NoOffload: off}) })
	}
}

func TestUDPRoundTrip(t *testing.T) {
	offloads(t, func(t *testing.T, cfg UDPConfig) {
		cfg.BatchSize = 16
		a, b := udpPair(t, cfg, addr2, addr3)
		if a.LocalGID() != verbs.GIDFromAddr(addr2) || a.LocalAddr().Port() != b.LocalAddr().Port() {
			t.Fatalf("a is %v (%v), b %v", a.LocalGID(), a.LocalAddr(), b.LocalAddr())
		}
		gso, gro := a.Offload()
		t.Logf("offload: gso %v, gro %v", gso, gro)
		if cfg.NoOffload && (gso || gro) {
			t.Error("offload on with NoOffload")
		}
		rx := slots(64, MaxPacketLen)
		for _, size := range []int{0, 64, 1024, MaxPacketLen} {
			for _, batch := range []int{1, 16, 50} { // 50 takes several system calls
				for _, dir := range [][2]*UDP{{a, b}, {b, a}} {
					src, dst := dir[0], dir[1]
					pkts := mkPkts(batch, size, dst.LocalGID(), 0)
					if n, err := src.Send(pkts); n != batch || err != nil {
						t.Fatalf("Send = %d, %v", n, err)
					}
					got := recvN(t, dst, batch, rx)
					for i := range got {
						if got[i].Addr != src.LocalGID() {
							t.Fatalf("source %v, want %v", got[i].Addr, src.LocalGID())
						}
						if size >= 4 {
							checkPayload(t, &got[i], size)
							if seqOf(&got[i]) != uint32(i) {
								t.Fatalf("packet %d is %d", i, seqOf(&got[i]))
							}
						} else if got[i].N != size {
							t.Fatalf("got %d bytes, want %d", got[i].N, size)
						}
					}
				}
			}
		}
		sa, sb := a.Stats(), b.Stats()
		if sa.TxPackets != 4*67 || sb.RxPackets != 4*67 || sa.TxBytes != sb.RxBytes || sa.Dropped()+sb.Dropped() != 0 {
			t.Errorf("stats a %+v, b %+v", sa, sb)
		}
	})
}

// TestUDPMixed sends runs that segmentation offload must split correctly:
// sizes change, a shorter packet ends a run, destinations interleave.
func TestUDPMixed(t *testing.T) {
	offloads(t, func(t *testing.T, cfg UDPConfig) {
		port := freePort(t)
		cfg.Port = port
		a, b := udpPair(t, cfg, addr2, addr3)
		cfg.Addr = netip.MustParseAddr("127.0.0.4")
		c, err := ListenUDP(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sizes := []int{100, 100, 100, 50, 100, 100, 200, 200, 4096, 4096, 4096, 4000, 7, 0, 0, 33, 33}
		var pkts []Packet
		for round := range 8 {
			for i, size := range sizes {
				p := mkPkts(1, max(size, 4), b.LocalGID(), uint32(len(pkts)))[0]
				p.N = size
				if round%2 == 1 && i%5 == 0 {
					p.Addr = c.LocalGID()
				}
				pkts = append(pkts, p)
			}
		}
		for i := 0; i < len(pkts); i += 40 { // batches that cut runs
			if _, err := a.Send(pkts[i:min(i+40, len(pkts))]); err != nil {
				t.Fatal(err)
			}
		}
		var toB, toC []Packet
		for _, p := range pkts {
			if p.Addr == b.LocalGID() {
				toB = append(toB, p)
			} else {
				toC = append(toC, p)
			}
		}
		for _, w := range []struct {
			r    *UDP
			want []Packet
		}{{b, toB}, {c, toC}} {
			got := recvN(t, w.r, len(w.want), slots(7, MaxPacketLen)) // odd slot count: splits runs
			for i := range got {
				want := &w.want[i]
				if got[i].N != want.N || string(got[i].Buf[:got[i].N]) != string(want.Buf[:want.N]) || got[i].Addr != a.LocalGID() {
					t.Fatalf("packet %d: got %d bytes from %v, want %d", i, got[i].N, got[i].Addr, want.N)
				}
			}
		}
		if s := a.Stats(); s.TxPackets != uint64(len(pkts)) {
			t.Errorf("TxPackets = %d, want %d", s.TxPackets, len(pkts))
		}
	})
}

func TestUDPIPv6(t *testing.T) {
	lo := netip.IPv6Loopback()
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	c.Close()
	a, err := ListenUDP(UDPConfig{Addr: lo, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// One wire talks to itself: ::1 is the only IPv6 loopback address.
	pkts := mkPkts(3, 100, a.LocalGID(), 0)
	pkts[1].Addr = verbs.GIDFromAddr(addr3) // IPv4 from an IPv6 socket: unreachable
	a.Send(pkts)
	got := recvN(t, a, 2, slots(4, 200))
	if got[0].Addr != a.LocalGID() || seqOf(&got[1]) != 2 {
		t.Errorf("got from %v, packets %d %d", got[0].Addr, seqOf(&got[0]), seqOf(&got[1]))
	}
	if s := a.Stats(); s.DropUnknown != 1 {
		t.Errorf("DropUnknown = %d, want 1", s.DropUnknown)
	}
}

func TestUDPConfig(t *testing.T) {
	for _, bad := range []netip.Addr{{}, netip.IPv4Unspecified(), netip.MustParseAddr("224.0.0.1")} {
		if _, err := ListenUDP(UDPConfig{Addr: bad}); err == nil {
			t.Errorf("ListenUDP(%v) succeeded", bad)
		}
	}
	port := freePort(t)
	u, err := ListenUDP(UDPConfig{Addr: netip.AddrFrom16(addr2.As16()), Port: port}) // IPv4-mapped is IPv4
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if u.LocalAddr() != netip.AddrPortFrom(addr2, port) || u.LocalGID() != verbs.GIDFromAddr(addr2) {
		t.Errorf("bound %v, GID %v", u.LocalAddr(), u.LocalGID())
	}
	if _, err := ListenUDP(UDPConfig{Addr: addr2, Port: port}); err == nil {
		t.Error("two wires bound the same address and port")
	}
	r, w := u.SocketBuffers()
	t.Logf("socket buffers: read %d, write %d", r, w)
	if r < 2*DefaultSocketBuffer && r < readSysctl(t, "rmem_max") {
		t.Errorf("SO_RCVBUF %d: neither forced nor at rmem_max", r)
	}
	var mtuDisc int
	u.rc.Control(func(fd uintptr) {
		mtuDisc, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER)
	})
	if err != nil || mtuDisc != unix.IP_PMTUDISC_DO {
		t.Errorf("IP_MTU_DISCOVER = %d, %v; want IP_PMTUDISC_DO", mtuDisc, err)
	}
	// Without segmentation, no UDP checksum, as rxe sends.
	gso, _ := u.Offload()
	var noCheck int
	u.rc.Control(func(fd uintptr) {
		noCheck, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK)
	})
	if err != nil || (noCheck == 1) == gso {
		t.Errorf("SO_NO_CHECK = %d, %v with UDP_SEGMENT %v; want 1 exactly without it", noCheck, err, gso)
	}
}

func readSysctl(t *testing.T, name string) int {
	var v int
	fd, err := unix.Open("/proc/sys/net/core/"+name, unix.O_RDONLY, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	buf := make([]byte, 32)
	n, _ := unix.Read(fd, buf)
	for _, c := range buf[:n] {
		if c >= '0' && c <= '9' {
			v = v*10 + int(c-'0')
		}
	}
	return v * 2
}

func TestUDPOversizeTruncated(t *testing.T) {
	offloads(t, testUDPOversizeTruncated)
}

func testUDPOversizeTruncated(t *testing.T, cfg UDPConfig) {
	a, b := udpPair(t, cfg, addr2, addr3)
	pkts := mkPkts(4, 100, b.LocalGID(), 0)
	pkts[1] = mkPkts(1, MaxPacketLen+1, b.LocalGID(), 1)[0]
	pkts[2] = mkPkts(1, 1000, b.LocalGID(), 2)[0] // longer than b's buffers
	if n, err := a.Send(pkts); n != 4 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if s := a.Stats(); s.DropOversize != 1 || s.TxPackets != 3 {
		t.Errorf("sender stats %+v", s)
	}
	rx := slots(4, 500)
	got := recvN(t, b, 2, rx)
	if seqOf(&got[0]) != 0 || seqOf(&got[1]) != 3 {
		t.Errorf("got %d, %d; want 0, 3", seqOf(&got[0]), seqOf(&got[1]))
	}
	if s := b.Stats(); s.DropTruncated != 1 || s.RxPackets != 2 {
		t.Errorf("receiver stats %+v", s)
	}
	// The kernel's own limit: past 65507 bytes even a loopback refuses
	// (EMSGSIZE) and the packet is dropped. Bypass MaxPacketLen to see it.
	huge := mkPkts(1, 70000, b.LocalGID(), 9)
	a.tx.mu.Lock()
	a.tx.setDst(0, huge[0].Addr, true)
	a.tx.iov[0].Base = &huge[0].Buf[0]
	a.tx.iov[0].SetLen(70000)
	h := &a.tx.msgs[0].Hdr
	h.Iov, h.Control = &a.tx.iov[0], nil
	h.SetIovlen(1)
	h.SetControllen(0)
	a.tx.off, a.tx.end = 0, 1
	err := a.rc.Write(a.tx.fn)
	errno := a.tx.errno
	a.tx.mu.Unlock()
	if err != nil || errno != unix.EMSGSIZE {
		t.Errorf("70000-byte datagram: %v, %v; want EMSGSIZE", err, errno)
	}
}

func TestUDPClose(t *testing.T) {
	a, b := udpPair(t, UDPConfig{}, addr2, addr3)
	errc := make(chan error)
	go func() {
		_, err := b.Recv(slots(4, 64))
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked Recv returned %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Recv")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := b.Recv(slots(1, 64)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if _, err := b.Send(mkPkts(1, 64, a.LocalGID(), 0)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	// Sending to a closed peer is a loss, not an error.
	if n, err := a.Send(mkPkts(1, 64, b.LocalGID(), 0)); n != 1 || err != nil {
		t.Errorf("Send to a closed peer = %d, %v", n, err)
	}
}

func TestUDPQueueOverflow(t *testing.T) {
	offloads(t, testUDPQueueOverflow)
}

func testUDPQueueOverflow(t *testing.T, cfg UDPConfig) {
	cfg.ReadBuffer = 64 << 10 // small: overflows fast
	a, b := udpPair(t, cfg, addr2, addr3)
	pkts := mkPkts(64, 1024, b.LocalGID(), 0)
	for range 10 {
		a.Send(pkts)
	}
	// Read whatever fit in the socket buffer.
	rx := slots(64, MaxPacketLen)
	var got int
	for queued(t, b) > 0 {
		n, err := b.Recv(rx)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	// The kernel reports drops with the next packet it queues.
	a.Send(pkts[:1])
	if _, err := b.Recv(rx); err != nil {
		t.Fatal(err)
	}
	s := b.Stats()
	t.Logf("received %d of 640, DropQueueFull %d", got, s.DropQueueFull)
	if s.DropQueueFull == 0 || got >= 640 {
		t.Errorf("no overflow seen")
	}
	// The kernel counts datagrams: a coalesced run is one.
	if gso, _ := a.Offload(); !gso && uint64(got)+s.DropQueueFull != 640 {
		t.Errorf("received %d, DropQueueFull %d; want 640 together", got, s.DropQueueFull)
	}
}

// queued is the length of the next datagram waiting on u's socket; 0 when
// none is.
func queued(t *testing.T, u *UDP) int {
	var n int
	var err error
	u.rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestUDPWithFaults(t *testing.T) {
	a, b := udpPair(t, UDPConfig{}, addr2, addr3)
	const n = 4000
	fa := WithFaults(a, Faults{Seed: 5, Loss: 0.2, Duplicate: 0.1, Reorder: 0.1})
	defer fa.Close()
	if fa.LocalGID() != a.LocalGID() {
		t.Errorf("LocalGID = %v", fa.LocalGID())
	}
	pkts := mkPkts(50, 256, b.LocalGID(), 0)
	seen := make([]int, n)
	rx := slots(64, MaxPacketLen)
	var received int
	for i := 0; i < n; i += len(pkts) {
		for j := range pkts {
			fill(&pkts[j], uint32(i+j))
		}
		if k, err := fa.Send(pkts); k != len(pkts) || err != nil {
			t.Fatalf("Send = %d, %v", k, err)
		}
		for uint64(received) < a.Stats().TxPackets {
			k, err := b.Recv(rx)
			if err != nil {
				t.Fatal(err)
			}
			for j := range rx[:k] {
				checkPayload(t, &rx[j], 256)
				seen[seqOf(&rx[j])]++
			}
			received += k
		}
	}
	s := fa.Stats()
	var unique, dups int
	for _, c := range seen {
		if c > 0 {
			unique++
			dups += c - 1
		}
	}
	t.Logf("stats %+v", s)
	// Held packets still in the decorator are not lost: at most a couple.
	if lost := n - unique; uint64(lost) < s.DropLoss || uint64(lost) > s.DropLoss+2 {
		t.Errorf("%d lost, Stats.DropLoss %d", lost, s.DropLoss)
	}
	within(t, "loss", int(s.DropLoss), n, 0.2)
	within(t, "duplicate", int(s.Duplicated), n-int(s.DropLoss), 0.1)
	if s.Reordered == 0 || s.TxPackets != uint64(received) {
		t.Errorf("reordered %d, tx %d, received %d", s.Reordered, s.TxPackets, received)
	}

	// Closing the decorator closes the wire under it.
	fa.Close()
	if _, err := a.Send(pkts); !errors.Is(err, net.ErrClosed) {
		t.Errorf("inner Send after decorator Close: %v", err)
	}
	if _, err := fa.Send(pkts); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
}

func TestUDPWithFaultsDelay(t *testing.T) {
	a, b := udpPair(t, UDPConfig{}, addr2, addr3)
	const delay = 20 * time.Millisecond
	fa := WithFaults(a, Faults{Delay: delay})
	defer fa.Close()
	start := time.Now()
	fa.Send(mkPkts(10, 64, b.LocalGID(), 0))
	got := recvN(t, b, 10, slots(10, 64))
	if d := time.Since(start); d < delay {
		t.Errorf("delivered after %v, want ≥ %v", d, delay)
	}
	for i := range got {
		if seqOf(&got[i]) != uint32(i) {
			t.Errorf("packet %d is %d", i, seqOf(&got[i]))
		}
	}
	// Delayed packets pending at Close are dropped and counted.
	fa.(FaultSetter).SetFaults(Faults{Delay: time.Hour})
	fa.Send(mkPkts(2, 64, b.LocalGID(), 0))
	fa.Close()
	if s := fa.Stats(); s.DropClosed != 2 || s.Delayed != 12 {
		t.Errorf("stats %+v", s)
	}
}

func TestUDPAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	offloads(t, testUDPAllocs)
}

func testUDPAllocs(t *testing.T, cfg UDPConfig) {
	a, b := udpPair(t, cfg, addr2, addr3)
	for _, batch := range []int{1, 64} {
		pkts := mkPkts(batch, 1024, b.LocalGID(), 0)
		rx := slots(batch, MaxPacketLen)
		round := func() {
			a.Send(pkts)
			for got := 0; got < batch; {
				n, err := b.Recv(rx[got:])
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		}
		round()
		if allocs := testing.AllocsPerRun(200, round); allocs != 0 {
			t.Errorf("batch %d: %v allocations per Send+Recv, want 0", batch, allocs)
		}
	}
}

// TestUDPRecvSourcePort: Recv says which port a datagram came from, as
// rxe sends from a port of its own (0xc000 plus a hash of the QPN) and the
// ICRC covers it.
func TestUDPRecvSourcePort(t *testing.T) {
	offloads(t, func(t *testing.T, cfg UDPConfig) {
		u, _ := udpPair(t, cfg, addr2, addr3)
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.WriteToUDP([]byte("from elsewhere"), net.UDPAddrFromAddrPort(u.LocalAddr())); err != nil {
			t.Fatal(err)
		}
		pkts := []Packet{{Buf: make([]byte, MaxPacketLen)}}
		if n, err := u.Recv(pkts); n != 1 || err != nil {
			t.Fatalf("Recv = %d, %v", n, err)
		}
		want := c.LocalAddr().(*net.UDPAddr).AddrPort()
		if p := pkts[0]; string(p.Buf[:p.N]) != "from elsewhere" || p.Addr != verbs.GIDFromAddr(addr3) || p.Port != want.Port() {
			t.Errorf("got %q from %v port %d, want from %v port %d", p.Buf[:p.N], p.Addr, p.Port, addr3, want.Port())
		}
	})
}

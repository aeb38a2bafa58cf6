// Package demo holds the demonstrations `rdmavisor demo` runs.
package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// VerbsOptions configure the two-QP demo.
type VerbsOptions struct {
	Messages int // SEND_WITH_IMM messages in the streaming phase
	Size     int // their size in bytes
	PingPong int // round trips in the latency phase
	MTU      verbs.MTU
}

// node is one side of the demo: a soft device on its own loopback address
// with a PD, a CQ, an RC QP and a registered region.
type node struct {
	name string
	dev  *soft.Device
	pd   verbs.PD
	cq   verbs.CQ
	qp   verbs.QP
	mr   verbs.MR
}

const regionSize = 4 << 20

func openNode(name string, addr netip.Addr, port uint16) (*node, error) {
	w, err := wire.ListenUDP(wire.UDPConfig{Addr: addr, Port: port})
	if err != nil {
		return nil, err
	}
	dev, err := soft.Open(soft.Config{Name: name, Wire: w})
	if err != nil {
		w.Close()
		return nil, err
	}
	n := &node{name: name, dev: dev}
	if n.pd, err = dev.AllocPD(); err != nil {
		return nil, errors.Join(err, n.close())
	}
	if n.cq, err = dev.CreateCQ(4096); err != nil {
		return nil, errors.Join(err, n.close())
	}
	n.qp, err = n.pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: n.cq, RecvCQ: n.cq,
		Cap: verbs.QPCap{MaxSendWR: 1024, MaxRecvWR: 1024, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, errors.Join(err, n.close())
	}
	if n.mr, err = n.pd.RegMR(regionSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		return nil, errors.Join(err, n.close())
	}
	return n, nil
}

func (n *node) close() error {
	var errs []error
	for _, c := range []io.Closer{n.qp, n.mr, n.cq, n.pd, n.dev} {
		if c != nil && !isNil(c) {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

func isNil(c io.Closer) bool {
	switch v := c.(type) {
	case verbs.QP:
		return v == nil
	case *soft.Device:
		return v == nil
	}
	return false
}

func (n *node) sge(off uint64, length int) [verbs.MaxSGE]verbs.SGE {
	return [verbs.MaxSGE]verbs.SGE{{Addr: n.mr.Addr() + off, Length: uint32(length), LKey: n.mr.LKey()}}
}

// poll waits for k completions on n's CQ, failing on any error status.
func (n *node) poll(ctx context.Context, wcs []verbs.WC, k int) error {
	got := 0
	for got < k {
		m := n.cq.Poll(wcs[got:k])
		for _, wc := range wcs[got : got+m] {
			if err := wc.Err(); err != nil {
				return fmt.Errorf("%s: %w", n.name, err)
			}
		}
		got += m
		if m == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("%s: waiting for %d completions: %w", n.name, k-got, err)
			}
		}
	}
	return nil
}

// freePort returns 4791, RoCEv2's port, when it is free on both addresses,
// else a free ephemeral port.
func freePort(a, b netip.Addr) (uint16, error) {
	try := func(port int) (uint16, bool) {
		c1, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, uint16(port))))
		if err != nil {
			return 0, false
		}
		defer c1.Close()
		p := c1.LocalAddr().(*net.UDPAddr).Port
		c2, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b, uint16(p))))
		if err != nil {
			return 0, false
		}
		c2.Close()
		return uint16(p), true
	}
	if p, ok := try(4791); ok {
		return p, nil
	}
	for range 20 {
		if p, ok := try(0); ok {
			return p, nil
		}
	}
	return 0, errors.New("demo: no UDP port free on both loopback addresses")
}

// Verbs runs two soft RDMA devices on UDP loopback (127.0.0.2 and
// 127.0.0.3), connects an RC QP on each, and exchanges messages, an RDMA
// WRITE and an RDMA READ, printing what it did.
func Verbs(ctx context.Context, out io.Writer, o VerbsOptions) (err error) {
	if o.Messages <= 0 || o.Size <= 0 || o.Size > regionSize/2 || o.PingPong <= 0 {
		return fmt.Errorf("demo: invalid options %+v", o)
	}
	addrA, addrB := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	port, err := freePort(addrA, addrB)
	if err != nil {
		return err
	}
	a, err := openNode("soft-a", addrA, port)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer func() { err = errors.Join(err, a.close()) }()
	b, err := openNode("soft-b", addrB, port)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer func() { err = errors.Join(err, b.close()) }()

	opt := verbs.PathOptions{MTU: o.MTU, Access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead, SQPSN: 0x100}
	gA, _ := a.dev.GID(0)
	gB, _ := b.dev.GID(0)
	if err := verbs.ConnectQP(a.qp, verbs.Remote{GID: gB, QPN: b.qp.QPN(), PSN: 0x100}, opt); err != nil {
		return err
	}
	if err := verbs.ConnectQP(b.qp, verbs.Remote{GID: gA, QPN: a.qp.QPN(), PSN: 0x100}, opt); err != nil {
		return err
	}
	fmt.Fprintf(out, "RDMAvisor verbs demo: two soft RDMA devices, RoCEv2 over UDP port %d\n", port)
	fmt.Fprintf(out, "  %s  GID %-10v RC QP %#06x\n", a.name, gA, a.qp.QPN())
	fmt.Fprintf(out, "  %s  GID %-10v RC QP %#06x   path MTU %v\n", b.name, gB, b.qp.QPN(), o.MTU)

	if err := stream(ctx, out, a, b, o); err != nil {
		return err
	}
	if err := writeRead(ctx, out, a, b); err != nil {
		return err
	}
	if err := pingPong(ctx, out, a, b, o.PingPong); err != nil {
		return err
	}
	for _, n := range []*node{a, b} {
		s := n.dev.Stats()
		fmt.Fprintf(out, "  %s wire: %d packets sent, %d received, %d ACKs, %d retransmits, %d malformed dropped\n",
			n.name, s.TxPackets, s.RxPackets, s.ACKsSent, s.Retransmits, s.RxMalformed)
	}
	fmt.Fprintln(out, "OK")
	return nil
}

// stream sends Messages SEND_WITH_IMM messages from a to b, 128 in flight,
// and checks every payload and immediate.
func stream(ctx context.Context, out io.Writer, a, b *node, o VerbsOptions) error {
	const window = 128
	slots := min(window, regionSize/o.Size)
	recv := func(i int) verbs.RecvWR {
		return verbs.RecvWR{WRID: uint64(i), NumSGE: 1, SG: b.sge(uint64(i%slots*o.Size), o.Size)}
	}
	rwrs := make([]verbs.RecvWR, slots)
	for i := range rwrs {
		rwrs[i] = recv(i)
	}
	if _, err := b.qp.PostRecv(rwrs); err != nil {
		return err
	}
	src := a.mr.Bytes()
	for i := range src[:o.Size] {
		src[i] = byte(i * 7)
	}
	start := time.Now()
	wcs := make([]verbs.WC, window)
	posted, sent, received := 0, 0, 0
	for received < o.Messages || sent < o.Messages {
		for posted < o.Messages && posted-sent < slots && posted-received < slots {
			wr := verbs.SendWR{WRID: uint64(posted), Opcode: verbs.WRSendWithImm, ImmData: uint32(posted), Flags: verbs.SendSignaled, NumSGE: 1, SG: a.sge(0, o.Size)}
			if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				return err
			}
			posted++
		}
		for _, n := range []*node{a, b} {
			k := n.cq.Poll(wcs)
			for _, wc := range wcs[:k] {
				if err := wc.Err(); err != nil {
					return fmt.Errorf("%s: %w", n.name, err)
				}
				if wc.Opcode != verbs.WCRecv {
					sent++
					continue
				}
				if wc.ImmData != uint32(received) || wc.ByteLen != uint32(o.Size) {
					return fmt.Errorf("demo: message %d arrived as imm %d, %d bytes", received, wc.ImmData, wc.ByteLen)
				}
				off := int(wc.WRID) % slots * o.Size
				if !bytes.Equal(b.mr.Bytes()[off:off+o.Size], src[:o.Size]) {
					return fmt.Errorf("demo: message %d corrupted", received)
				}
				received++
				if _, err := b.qp.PostRecv([]verbs.RecvWR{recv(int(wc.WRID))}); err != nil {
					return err
				}
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	el := time.Since(start)
	fmt.Fprintf(out, "SEND_WITH_IMM  %d messages of %d B, each checked: %.0f msgs/s, %.1f MB/s\n",
		o.Messages, o.Size, float64(o.Messages)/el.Seconds(), float64(o.Messages*o.Size)/el.Seconds()/1e6)
	return nil
}

// writeRead writes 1 MiB into b's region with RDMA WRITE, reads it back into
// a's region with RDMA READ, and compares.
func writeRead(ctx context.Context, out io.Writer, a, b *node) error {
	const n = 1 << 20
	src := a.mr.Bytes()[:n]
	for i := range src {
		src[i] = byte(i*31 + 5)
	}
	wcs := make([]verbs.WC, 1)
	start := time.Now()
	wr := verbs.SendWR{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SG: a.sge(0, n), RemoteAddr: b.mr.Addr() + n, RKey: b.mr.RKey()}
	if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		return err
	}
	if err := a.poll(ctx, wcs, 1); err != nil {
		return err
	}
	tw := time.Since(start)
	start = time.Now()
	rd := verbs.SendWR{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, NumSGE: 1, SG: a.sge(2*n, n), RemoteAddr: b.mr.Addr() + n, RKey: b.mr.RKey()}
	if _, err := a.qp.PostSend([]verbs.SendWR{rd}); err != nil {
		return err
	}
	if err := a.poll(ctx, wcs, 1); err != nil {
		return err
	}
	tr := time.Since(start)
	if !bytes.Equal(a.mr.Bytes()[2*n:3*n], src) || !bytes.Equal(b.mr.Bytes()[n:2*n], src) {
		return errors.New("demo: RDMA WRITE then READ of 1 MiB did not return the same bytes")
	}
	fmt.Fprintf(out, "RDMA_WRITE     1 MiB in %v; RDMA_READ 1 MiB back in %v; bytes identical\n", tw.Round(time.Microsecond), tr.Round(time.Microsecond))
	return nil
}

// pingPong measures round trips of 64-byte sends.
func pingPong(ctx context.Context, out io.Writer, a, b *node, rounds int) error {
	wcs := make([]verbs.WC, 2)
	rtts := make([]time.Duration, 0, rounds)
	post := func(n *node, off uint64) error {
		_, err := n.qp.PostRecv([]verbs.RecvWR{{WRID: 9, NumSGE: 1, SG: n.sge(off, 64)}})
		return err
	}
	send := func(n *node) error {
		_, err := n.qp.PostSend([]verbs.SendWR{{WRID: 8, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, NumSGE: 1, SG: n.sge(0, 64)}})
		return err
	}
	for range rounds {
		if err := errors.Join(post(a, 1<<21), post(b, 1<<21)); err != nil {
			return err
		}
		start := time.Now()
		if err := send(a); err != nil {
			return err
		}
		if err := b.poll(ctx, wcs, 1); err != nil {
			return err
		}
		if err := send(b); err != nil {
			return err
		}
		if err := a.poll(ctx, wcs, 1); err != nil { // a's send or the reply
			return err
		}
		if err := a.poll(ctx, wcs[1:], 1); err != nil {
			return err
		}
		rtts = append(rtts, time.Since(start))
		if err := b.poll(ctx, wcs, 1); err != nil { // b's send completion
			return err
		}
	}
	slices.Sort(rtts)
	fmt.Fprintf(out, "ping-pong      %d round trips of 64 B: p50 %v, p99 %v\n", rounds,
		rtts[len(rtts)/2].Round(time.Microsecond), rtts[len(rtts)*99/100].Round(time.Microsecond))
	return nil
}

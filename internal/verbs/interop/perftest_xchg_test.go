package interop

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// perftest's out-of-band exchange, as perftest 6.06 speaks it (Debian
// bookworm's perftest 4.5+0.17-1, which the rxe guest runs; read in
// linux-rdma/perftest src/perftest_communication.c, send_bw.c, write_bw.c
// and checked against a capture of two 6.06 tools): a TCP connection to the
// server's port 18515 (neither -R nor -z: with those it is rdma_cm, which
// the soft provider does not speak), on which every step is one write(2)
// of a fixed size per side and a read(2) that must return all of it. In
// each step the client (the side given a server name) writes first and
// then reads; the server reads first. The steps:
//
//  1. versions: 16 bytes, the NUL-padded version string;
//  2. (remote version >= 5.32) the cycle buffer (page size) and the cache
//     line size: 4-byte big-endian ints each, two steps; both sides take
//     the larger;
//  3. (>= 5.31) the active MTU: its enum ibv_mtu value in decimal and a
//     NUL, 2 bytes; both sides take the smaller;
//  4. handshakes: one pingpong_dest per QP, in text (ptDest), repeated
//     unchanged as a barrier: ib_send_bw exchanges them 4 times before the
//     traffic (the last after the server posted its receives) and once
//     after it; ib_write_bw 3 times before, and once after, followed by
//     the bandwidth reports (ptReport) and once more;
//  5. each side writes "done" and a NUL, and closes.
//
// Later perftest versions added steps (a parameter negotiation before 4):
// the version check in hello refuses any version but 6.06.
const (
	ptVersion    = "6.06"
	ptPort       = 18515
	ptVersionLen = 16 // MAX_VERSION
	ptDestLen    = 108
	ptPageSize   = 4096 // DEF_PAGE_SIZE, perftest's cycle buffer
	ptCacheLine  = 64   // DEF_CACHE_LINE_SIZE
)

// ptDest is struct pingpong_dest as perftest writes it with a GID index
// (-x): "%04x:%04x:%06x:%06x:%08x:%016llx:" for LID, outstanding reads,
// QPN, PSN, rkey and the virtual address of the buffer the peer writes
// into, the 16 GID bytes as "%02x" joined by colons, ":%08x:" for the XRC
// SRQ number, NUL-padded to 108 bytes.
type ptDest struct {
	LID, OutReads uint16
	QPN, PSN      uint32
	RKey          uint32
	VAddr         uint64
	GID           verbs.GID
	SRQN          uint32
}

func (d ptDest) wire() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x", d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr)
	for _, g := range d.GID {
		fmt.Fprintf(&b, ":%02x", g)
	}
	fmt.Fprintf(&b, ":%08x:", d.SRQN)
	msg := make([]byte, ptDestLen)
	copy(msg, b.String())
	return msg
}

func parsePTDest(b []byte) (ptDest, error) {
	s, _, _ := strings.Cut(string(b), "\x00")
	f := strings.Split(s, ":")
	// 6 numbers, 16 GID bytes, the SRQN and the empty field after the
	// trailing colon.
	if len(b) != ptDestLen || len(f) != 24 || f[23] != "" {
		return ptDest{}, fmt.Errorf("perftest destination %q: want %d bytes of LID:OUT_READS:QPN:PSN:RKEY:VADDR:16 GID bytes:SRQN:", b, ptDestLen)
	}
	var v [23]uint64
	widths := [23]int{4: 32, 5: 64}
	for i := range v {
		w := widths[i]
		switch {
		case w != 0:
		case i < 2:
			w = 16
		case i < 4:
			w = 24
		case i < 22:
			w = 8
		default:
			w = 32
		}
		n, err := strconv.ParseUint(f[i], 16, w)
		if err != nil {
			return ptDest{}, fmt.Errorf("perftest destination %q: field %d: %w", b, i, err)
		}
		v[i] = n
	}
	d := ptDest{LID: uint16(v[0]), OutReads: uint16(v[1]), QPN: uint32(v[2]), PSN: uint32(v[3]),
		RKey: uint32(v[4]), VAddr: v[5], SRQN: uint32(v[22])}
	for i := range d.GID {
		d.GID[i] = byte(v[6+i])
	}
	return d, nil
}

// ptReport is struct bw_report_data as xchg_bw_reports sends it: size,
// iterations (8 bytes each from 5.33 on), peak and average bandwidth in
// MB/s (MiB) and the message rate in Mpps, doubles, each big-endian and
// each a step of its own.
type ptReport struct {
	Size, Iters          uint64
	BWPeak, BWAvg, MRate float64
}

// ptConn is our end of a perftest connection.
type ptConn struct {
	c      net.Conn
	client bool // we dialed: we write first in every step
}

// step is one of perftest's exchanges: the client writes mine, then
// reads len(theirs) bytes; the server the other way round.
func (p *ptConn) step(what string, mine, theirs []byte) error {
	write := func() error {
		if n, err := p.c.Write(mine); err != nil || n != len(mine) {
			return fmt.Errorf("perftest exchange: %s: wrote %d of %d bytes: %w", what, n, len(mine), err)
		}
		return nil
	}
	read := func() error {
		if _, err := io.ReadFull(p.c, theirs); err != nil {
			return fmt.Errorf("perftest exchange: %s: read %d bytes: %w", what, len(theirs), err)
		}
		return nil
	}
	if p.client {
		if err := write(); err != nil {
			return err
		}
		return read()
	}
	if err := read(); err != nil {
		return err
	}
	return write()
}

// hello runs steps 1 to 3 and returns the path MTU: the smaller of mtu and
// the peer's.
func (p *ptConn) hello(mtu verbs.MTU) (verbs.MTU, error) {
	mine, theirs := make([]byte, ptVersionLen), make([]byte, ptVersionLen)
	copy(mine, ptVersion)
	if err := p.step("version", mine, theirs); err != nil {
		return 0, err
	}
	if v, _, _ := bytes.Cut(theirs, []byte{0}); string(v) != ptVersion {
		return 0, fmt.Errorf("perftest exchange: the peer is perftest %q; this exchange is perftest %s's", v, ptVersion)
	}
	for _, sys := range []struct {
		what string
		v    uint32
	}{{"cycle buffer", ptPageSize}, {"cache line size", ptCacheLine}} {
		var m, r [4]byte
		binary.BigEndian.PutUint32(m[:], sys.v)
		if err := p.step(sys.what, m[:], r[:]); err != nil {
			return 0, err
		}
		// perftest takes the larger: ours are its defaults, so a larger
		// one would change where it puts its buffers, not the exchange.
		if got := binary.BigEndian.Uint32(r[:]); got != sys.v {
			return 0, fmt.Errorf("perftest exchange: the peer's %s is %d, want %d", sys.what, got, sys.v)
		}
	}
	var r [2]byte
	if err := p.step("MTU", []byte{'0' + byte(mtu), 0}, r[:]); err != nil {
		return 0, err
	}
	theirMTU := verbs.MTU(r[0] - '0')
	if r[1] != 0 || theirMTU.Bytes() == 0 {
		return 0, fmt.Errorf("perftest exchange: MTU %q: want an enum ibv_mtu digit and a NUL", r[:])
	}
	return min(mtu, theirMTU), nil
}

// handShake is step 4 once: it sends mine and returns the peer's.
func (p *ptConn) handShake(mine ptDest) (ptDest, error) {
	theirs := make([]byte, ptDestLen)
	if err := p.step("handshake", mine.wire(), theirs); err != nil {
		return ptDest{}, err
	}
	return parsePTDest(theirs)
}

// reports exchanges bandwidth reports field by field.
func (p *ptConn) reports(mine ptReport) (ptReport, error) {
	var theirs ptReport
	fields := []struct {
		name string
		v    uint64
		to   any
	}{
		{"report size", mine.Size, &theirs.Size},
		{"report iterations", mine.Iters, &theirs.Iters},
		{"report peak", math.Float64bits(mine.BWPeak), &theirs.BWPeak},
		{"report average", math.Float64bits(mine.BWAvg), &theirs.BWAvg},
		{"report message rate", math.Float64bits(mine.MRate), &theirs.MRate},
	}
	for _, f := range fields {
		var m, r [8]byte
		binary.BigEndian.PutUint64(m[:], f.v)
		if err := p.step(f.name, m[:], r[:]); err != nil {
			return ptReport{}, err
		}
		v := binary.BigEndian.Uint64(r[:])
		switch to := f.to.(type) {
		case *uint64:
			*to = v
		case *float64:
			*to = math.Float64frombits(v)
		}
	}
	return theirs, nil
}

// done is step 5: it writes "done", as perftest does, and reads the
// peer's. perftest closes after its write without reading ours: the
// connection may then be reset, but only after its "done" is here.
func (p *ptConn) done() error {
	if _, err := p.c.Write([]byte("done\x00")); err != nil {
		return fmt.Errorf("perftest exchange: write done: %w", err)
	}
	var r [5]byte
	if _, err := io.ReadFull(p.c, r[:]); err != nil || string(r[:]) != "done\x00" {
		return fmt.Errorf("perftest exchange: %q, %v; want done", r[:], err)
	}
	return nil
}

// glibcRand is glibc's rand(3) (random(3) with its default TYPE_3 state:
// an additive feedback generator over 31 words), which perftest fills its
// buffers with after srand(time(NULL)): what it sends is predictable from
// the second it started in.
type glibcRand struct {
	r    [34]int32 // the last 34 values of the recurrence, a ring
	i    int
	seen int
}

func newGlibcRand(seed uint32) *glibcRand {
	g := &glibcRand{}
	if seed == 0 {
		seed = 1
	}
	g.r[0] = int32(seed)
	for i := 1; i < 31; i++ {
		// 16807 * r[i-1] mod (2^31 - 1), Schrage's way, in 32-bit
		// arithmetic as glibc does it (the seed may be "negative").
		hi, lo := g.r[i-1]/127773, g.r[i-1]%127773
		w := 16807*lo - 2836*hi
		if w < 0 {
			w += 2147483647
		}
		g.r[i] = w
	}
	for i := 31; i < 34; i++ {
		g.r[i] = g.r[i-31]
	}
	g.i = 34
	for range 310 {
		g.step()
	}
	return g
}

// step computes the next value of r[k] = r[k-31] + r[k-3].
func (g *glibcRand) step() int32 {
	v := g.r[(g.i-31)%34] + g.r[(g.i-3)%34]
	g.r[g.i%34] = v
	g.i++
	return v
}

// next is rand().
func (g *glibcRand) next() int32 { return int32(uint32(g.step()) >> 1) }

// glibcRandBytes is perftest's buffer after srand(seed): n bytes, each the
// low byte of one rand().
func glibcRandBytes(seed uint32, n int) []byte {
	g := newGlibcRand(seed)
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.next())
	}
	return b
}

// ptSeed finds the srand seed (a time(2) within window seconds of now)
// whose rand() stream starts with got, as perftest's buffer does.
func ptSeed(got []byte, now int64, window int64) (uint32, bool) {
	probe := got[:min(len(got), 16)]
	for d := int64(0); d <= window; d++ {
		for _, s := range []int64{now - d, now + d} {
			if bytes.Equal(glibcRandBytes(uint32(s), len(probe)), probe) {
				return uint32(s), true
			}
		}
	}
	return 0, false
}

// A handshake of ib_write_bw 6.06 on rxe, as captured.
const ptGolden = "0000:0001:000015:ebe486:00000650:00005646fa7ba000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:63:00:02:00000000:"

func TestPerftestDest(t *testing.T) {
	want := ptDest{LID: 0, OutReads: 1, QPN: 0x15, PSN: 0xebe486, RKey: 0x650, VAddr: 0x5646fa7ba000,
		GID: verbs.GIDFromAddr(netip.MustParseAddr("10.99.0.2"))}
	golden := make([]byte, ptDestLen)
	copy(golden, ptGolden)
	if got := want.wire(); !bytes.Equal(got, golden) {
		t.Errorf("wire:\n%q\nwant\n%q", got, golden)
	}
	got, err := parsePTDest(golden)
	if err != nil || got != want {
		t.Errorf("parse: %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", ptGolden[:50], strings.Replace(ptGolden, "ebe486", "1ebe486", 1), strings.Replace(ptGolden, ":0a:", ":xa:", 1)} {
		b := make([]byte, ptDestLen)
		copy(b, bad)
		if d, err := parsePTDest(b); err == nil {
			t.Errorf("parse %q: %+v, want an error", bad, d)
		}
	}
}

func FuzzPerftestDest(f *testing.F) {
	golden := make([]byte, ptDestLen)
	copy(golden, ptGolden)
	f.Add(golden)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := parsePTDest(b)
		if err != nil {
			return
		}
		if back, err := parsePTDest(d.wire()); err != nil || back != d {
			t.Errorf("%+v: round trip %+v, %v", d, back, err)
		}
	})
}

// TestGlibcRand checks the generator against glibc's own rand() after
// srand(seed).
func TestGlibcRand(t *testing.T) {
	for _, c := range []struct {
		seed uint32
		want []int32
	}{
		{0, []int32{1804289383, 846930886, 1681692777}}, // srand(0) is srand(1)
		{1, []int32{1804289383, 846930886, 1681692777, 1714636915, 1957747793, 424238335}},
		{42, []int32{71876166, 708592740, 1483128881, 907283241, 442951012, 537146758}},
		{1700000000, []int32{280491303, 626398474, 65378190, 821524244, 1465218044, 821971775}},
	} {
		g := newGlibcRand(c.seed)
		for i, w := range c.want {
			if got := g.next(); got != w {
				t.Errorf("srand(%d): rand() #%d = %d, want %d", c.seed, i, got, w)
			}
		}
	}
	b := glibcRandBytes(1700000000, 4096)
	if s, ok := ptSeed(b[:100], 1700000000+1234, 3600); !ok || s != 1700000000 {
		t.Errorf("ptSeed: %d, %v; want 1700000000", s, ok)
	}
}

// TestPerftestExchange runs our exchange against itself, one side the
// client and one the server, over loopback TCP.
func TestPerftestExchange(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		mtu  verbs.MTU
		dest ptDest
		rep  ptReport
		err  error
	}
	run := func(c net.Conn, client bool, mtu verbs.MTU, d ptDest, rep ptReport) (r result) {
		defer c.Close()
		p := &ptConn{c: c, client: client}
		if r.mtu, r.err = p.hello(mtu); r.err != nil {
			return r
		}
		if r.dest, r.err = p.handShake(d); r.err != nil {
			return r
		}
		if r.rep, r.err = p.reports(rep); r.err != nil {
			return r
		}
		if r.err = p.done(); r.err != nil {
			return r
		}
		return r
	}
	srv := make(chan result, 1)
	sd, sr := ptDest{QPN: 0x11, PSN: 0x22, GID: verbs.GID{15: 1}}, ptReport{Size: 1}
	cd, cr := ptDest{QPN: 0x33, PSN: 0x44, RKey: 0x55, VAddr: 0x66, GID: verbs.GID{15: 2}}, ptReport{Size: 4096, Iters: 1000, BWAvg: 12.5, MRate: 0.003}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srv <- result{err: err}
			return
		}
		srv <- run(c, false, verbs.MTU1024, sd, sr)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cli := run(c, true, verbs.MTU4096, cd, cr)
	s := <-srv
	if cli.err != nil || s.err != nil {
		t.Fatalf("client: %v; server: %v", cli.err, s.err)
	}
	if cli.mtu != verbs.MTU1024 || s.mtu != verbs.MTU1024 || cli.dest != sd || s.dest != cd || cli.rep != sr || s.rep != cr {
		t.Errorf("client got %+v, server got %+v", cli, s)
	}
}

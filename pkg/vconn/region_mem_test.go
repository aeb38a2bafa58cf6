package vconn_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// regionPair is a vconn pair through two agents whose server side
// exported a region of size bytes, mapped or over the socket, and whose
// client knows its id.
type regionPair struct {
	ctx    context.Context
	ca, cb *vconn.Client
	c, srv *vconn.Conn
	r      *vconn.Region
	id     uint32
}

func newRegionPair(t *testing.T, size int, mapped bool) *regionPair {
	t.Helper()
	cl := cluster(t, agenttest.Options{})
	p := &regionPair{ctx: testCtx(t), ca: client(t, cl.Nodes[0], "a", 4), cb: client(t, cl.Nodes[1], "b", 4)}
	if !mapped {
		p.cb.WithoutFeatures()
	}
	ln, err := p.cb.Listen(p.ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	if p.c, err = p.ca.Dial(p.ctx, "node-b:9"); err != nil {
		t.Fatal(err)
	}
	if p.srv, err = ln.AcceptVConn(); err != nil {
		t.Fatal(err)
	}
	if p.r, err = p.srv.Export(p.ctx, size, vconn.AccessRead|vconn.AccessWrite); err != nil {
		t.Fatal(err)
	}
	if p.r.Mapped() != mapped {
		t.Fatalf("region mapped: %v, want %v", p.r.Mapped(), mapped)
	}
	if err := p.srv.SendMsgImm(p.ctx, nil, p.r.ID()); err != nil {
		t.Fatal(err)
	}
	m, err := p.c.RecvMsg(p.ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.id = m.Imm
	return p
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i) ^ byte(i>>8)*31
	}
	return b
}

// TestRegionBothWays: what the exporting pod writes with WriteAt (in its
// mapping, or over the socket) the peer reads with RDMA READ, and what the
// peer writes with RDMA WRITE the pod reads with ReadAt, byte for byte,
// at unaligned offsets and across many frames' worth of bytes; a range
// past the region fails with ErrRegion and touches nothing.
func TestRegionBothWays(t *testing.T) {
	for _, mapped := range []bool{true, false} {
		t.Run(map[bool]string{true: "mapped", false: "socket"}[mapped], func(t *testing.T) {
			const size = 300_001
			p := newRegionPair(t, size, mapped)
			ctx, r := p.ctx, p.r
			mine := pattern(200_000, 1)
			if err := r.WriteAt(ctx, mine, 7); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(mine))
			if err := p.c.ReadRegion(ctx, p.id, 7, got); err != nil || !bytes.Equal(got, mine) {
				t.Fatalf("the peer's RDMA READ of what the pod wrote: %v (equal: %v)", err, bytes.Equal(got, mine))
			}
			theirs := pattern(size-100_001, 2)
			if err := p.c.WriteRegion(ctx, p.id, 100_001, theirs); err != nil {
				t.Fatal(err)
			}
			got = make([]byte, size)
			if err := r.ReadAt(ctx, got, 0); err != nil {
				t.Fatal(err)
			}
			want := append(append(make([]byte, 7), mine[:100_001-7]...), theirs...)
			if !bytes.Equal(got, want) {
				t.Fatal("the pod's ReadAt does not read what both sides wrote")
			}
			for _, x := range []struct {
				off int64
				n   int
			}{{size - 1, 2}, {size, 1}, {-1, 1}, {1 << 40, 1}} {
				if err := r.ReadAt(ctx, make([]byte, x.n), x.off); !errors.Is(err, vconn.ErrRegion) {
					t.Errorf("ReadAt of %d bytes at %d: %v, want ErrRegion", x.n, x.off, err)
				}
				if err := r.WriteAt(ctx, make([]byte, x.n), x.off); !errors.Is(err, vconn.ErrRegion) {
					t.Errorf("WriteAt of %d bytes at %d: %v, want ErrRegion", x.n, x.off, err)
				}
			}
			if err := r.ReadAt(ctx, got[:1], size-1); err != nil || got[0] != want[size-1] {
				t.Fatalf("ReadAt of the last byte after refused writes: %v, %#x want %#x", err, got[0], want[size-1])
			}
		})
	}
}

// TestRegionEnds: after the region's Close ReadAt and WriteAt fail with
// ErrRegion, after the vconn's with net.ErrClosed, and after the client's
// (the session's end) as well, mapped or not.
func TestRegionEnds(t *testing.T) {
	for _, mapped := range []bool{true, false} {
		t.Run(map[bool]string{true: "mapped", false: "socket"}[mapped], func(t *testing.T) {
			p := newRegionPair(t, 4096, mapped)
			ctx := p.ctx
			b := make([]byte, 8)
			if err := p.r.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := p.r.ReadAt(ctx, b, 0); !errors.Is(err, vconn.ErrRegion) {
				t.Errorf("ReadAt after the region's Close: %v, want ErrRegion", err)
			}
			if err := p.r.WriteAt(ctx, b, 0); !errors.Is(err, vconn.ErrRegion) {
				t.Errorf("WriteAt after the region's Close: %v, want ErrRegion", err)
			}
			r2, err := p.srv.Export(ctx, 4096, vconn.AccessRead)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.srv.Close(); err != nil {
				t.Fatal(err)
			}
			if err := r2.ReadAt(ctx, b, 0); !errors.Is(err, net.ErrClosed) {
				t.Errorf("ReadAt after the vconn's Close: %v, want net.ErrClosed", err)
			}
			ln, err := p.cb.Listen(ctx, ":10")
			if err != nil {
				t.Fatal(err)
			}
			c3, err := p.ca.Dial(ctx, "node-b:10")
			if err != nil {
				t.Fatal(err)
			}
			defer c3.Close()
			s3, err := ln.AcceptVConn()
			if err != nil {
				t.Fatal(err)
			}
			r3, err := s3.Export(ctx, 4096, vconn.AccessRead)
			if err != nil {
				t.Fatal(err)
			}
			_ = p.cb.Close()
			if err := r3.ReadAt(ctx, b, 0); !errors.Is(err, net.ErrClosed) {
				t.Errorf("ReadAt after the client's Close: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestMappedRegionAllocatesNothing: a mapped region's ReadAt and WriteAt
// are copies and nothing more.
func TestMappedRegionAllocatesNothing(t *testing.T) {
	p := newRegionPair(t, 64<<10, true)
	buf := make([]byte, 4096)
	if n := testing.AllocsPerRun(1000, func() {
		if err := p.r.WriteAt(p.ctx, buf, 100); err != nil {
			t.Fatal(err)
		}
		if err := p.r.ReadAt(p.ctx, buf, 200); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per WriteAt and ReadAt, want 0", n)
	}
}

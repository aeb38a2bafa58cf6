package vconn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// regionPair is a vconn pair through two agents whose server side
// exported a region of size bytes, and whose client knows its id: with
// the memfd features (the region mapped, one-sided operations through
// staging memory) or without (everything in frames).
type regionPair struct {
	ctx    context.Context
	cl     *agenttest.Cluster
	ca, cb *vconn.Client
	c, srv *vconn.Conn
	r      *vconn.Region
	id     uint32
}

func newRegionPair(t testing.TB, size int, mapped bool) *regionPair {
	t.Helper()
	cl := cluster(t, agenttest.Options{})
	p := &regionPair{ctx: testCtx(t), cl: cl, ca: client(t, cl.Nodes[0], "a", 4), cb: client(t, cl.Nodes[1], "b", 4)}
	if !mapped {
		p.ca.WithoutFeatures()
		p.cb.WithoutFeatures()
	}
	p.c, p.srv = shmPair(t, p.ca, p.cb, "node-b")
	var err error
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
		t.Run(map[bool]string{true: "memfd", false: "socket"}[mapped], func(t *testing.T) {
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
			if p.c.Staged() != mapped {
				t.Fatalf("one-sided operations through staging memory: %v, want %v", p.c.Staged(), mapped)
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
		t.Run(map[bool]string{true: "memfd", false: "socket"}[mapped], func(t *testing.T) {
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

// TestStagedConcurrent: goroutines of one vconn write and read the peer's
// region at once through its staging memory, some in more pieces than it
// has slots, each its own range, byte for byte; once both vconns are
// closed neither agent holds registered memory (the region, the staging).
func TestStagedConcurrent(t *testing.T) {
	const per, workers = 70_000, 8
	p := newRegionPair(t, per*workers, true)
	ctx := p.ctx
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := uint64(w * per)
			for round := range 5 {
				mine := pattern(per, byte(w*16+round))
				if err := p.c.WriteRegion(ctx, p.id, off, mine); err != nil {
					errs <- err
					return
				}
				got := make([]byte, per)
				if err := p.c.ReadRegion(ctx, p.id, off, got); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, mine) {
					errs <- fmt.Errorf("worker %d round %d: read back other bytes than written", w, round)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !p.c.Staged() {
		t.Fatal("the operations did not go through staging memory")
	}
	whole := make([]byte, per*workers)
	if err := p.r.ReadAt(ctx, whole, 0); err != nil {
		t.Fatal(err)
	}
	for w := range workers {
		if !bytes.Equal(whole[w*per:(w+1)*per], pattern(per, byte(w*16+4))) {
			t.Errorf("the exporter reads other bytes than worker %d wrote last", w)
		}
	}
	// The exporter first: its unexport is confirmed by a peer still there.
	if err := p.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range p.cl.Nodes {
		deadline := time.Now().Add(10 * time.Second)
		for n.Agent.Engine().Stats().RegisteredBytes != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s still has %d bytes registered after both vconns closed", n.Name, n.Agent.Engine().Stats().RegisteredBytes)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestStagedCancel: an operation whose caller stops waiting keeps its
// slot of staging memory until the agent answered, and then gives it
// back: later operations find every slot, and their bytes are right.
func TestStagedCancel(t *testing.T) {
	p := newRegionPair(t, 1<<20, true)
	ctx := p.ctx
	want := pattern(1<<20, 9)
	if err := p.r.WriteAt(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		cctx, cancel := context.WithCancel(ctx)
		go cancel()
		_ = p.c.ReadRegion(cctx, p.id, 0, make([]byte, 1<<20))
		cancel()
	}
	got := make([]byte, 1<<20)
	if err := p.c.ReadRegion(ctx, p.id, 0, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read after cancelled ones: %v (equal: %v)", err, bytes.Equal(got, want))
	}
	if !p.c.Staged() {
		t.Fatal("the operations did not go through staging memory")
	}
}

// TestStagingCounts: a vconn's staging memory counts against its
// allocation's limits.regionBytes while the vconn lives (an export that
// would pass the limit with it is refused, and allowed once the vconn is
// closed), and a vconn the agent refuses staging memory carries its
// one-sided operations in frames instead.
func TestStagingCounts(t *testing.T) {
	cl := cluster(t, agenttest.Options{TuneConfig: func(c *config.AgentConfig) { c.Limits.RegionBytes = 300 << 10 }})
	ctx := testCtx(t)
	ca, cb := client(t, cl.Nodes[0], "a", 4), client(t, cl.Nodes[1], "b", 4)
	ln, err := cb.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dial := func() (*vconn.Conn, *vconn.Conn, uint32) {
		t.Helper()
		c, err := ca.Dial(ctx, "node-b:9")
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.AcceptVConn()
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Export(ctx, 4096, vconn.AccessRead|vconn.AccessWrite)
		if err != nil {
			t.Fatal(err)
		}
		// The export reaches c before a message sent after it: c uses
		// the region once it read one, as a program told its id would.
		if _, err := s.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		return c, s, r.ID()
	}
	c1, s1, id1 := dial()
	defer s1.Close()
	if err := c1.WriteRegion(ctx, id1, 0, []byte("staged")); err != nil {
		t.Fatal(err)
	}
	if !c1.Staged() {
		t.Fatal("no staging memory within the limit")
	}
	if _, err := c1.Export(ctx, 64<<10, vconn.AccessRead); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("an export past limits.regionBytes with the staging memory counted: %v, want ErrLimit", err)
	}
	// A second vconn's staging memory would pass the limit: refused, and
	// its operations go in frames.
	c2, s2, id2 := dial()
	defer s2.Close()
	defer c2.Close()
	if err := c2.WriteRegion(ctx, id2, 0, []byte("in frames")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 9)
	if err := c2.ReadRegion(ctx, id2, 0, got); err != nil || string(got) != "in frames" || c2.Staged() {
		t.Fatalf("one-sided operations past the limit: %q, %v, staged %v; want them in frames", got, err, c2.Staged())
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := c2.Export(ctx, 64<<10, vconn.AccessRead)
		if err == nil {
			_ = r.Close(ctx)
			break
		}
		if !errors.Is(err, vconn.ErrLimit) || time.Now().After(deadline) {
			t.Fatalf("an export once the staging memory's vconn closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package vconn_test

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestRegionEndRacesItsUsers closes exported regions, and whole vconns,
// while the peer writes and reads them with one-sided operations and the
// exporting pod copies in and out of them. Nothing may touch unmapped
// memory (the agent would die with every tenant); every user ends with an
// error that says the region or the vconn is gone; and no shared QP fails
// (a late one-sided operation meeting a dead key would fail it, and every
// other tenant's vconn on it): bystander vconns between the same two nodes
// still work at the end.
func TestRegionEndRacesItsUsers(t *testing.T) {
	cl := cluster(t, agenttest.Options{})
	a, b := client(t, cl.Nodes[0], "a", 64), client(t, cl.Nodes[1], "b", 64)
	ctx := testCtx(t)
	ln, err := b.Listen(ctx, ":21")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	gone := func(err error) bool {
		for _, e := range []error{vconn.ErrRegion, vconn.ErrClosed, vconn.ErrReset, vconn.ErrPeerGone, net.ErrClosed} {
			if errors.Is(err, e) {
				return true
			}
		}
		return false
	}
	bystanders := make([]*vconn.Conn, 8)
	for i := range bystanders {
		bl, err := b.Listen(ctx, fmt.Sprintf(":%d", 100+i))
		if err != nil {
			t.Fatal(err)
		}
		defer bl.Close()
		go func() {
			s, err := bl.AcceptVConn()
			if err != nil {
				return
			}
			defer s.Close()
			for {
				m, err := s.RecvMsg(ctx)
				if err != nil || s.SendMsg(ctx, m.Data) != nil {
					return
				}
			}
		}()
		if bystanders[i], err = a.Dial(ctx, fmt.Sprintf("node-b:%d", 100+i)); err != nil {
			t.Fatal(err)
		}
		defer bystanders[i].Close()
	}
	for round := range 10 {
		c, err := a.Dial(ctx, "node-b:21")
		if err != nil {
			t.Fatal(err)
		}
		srv, err := ln.AcceptVConn()
		if err != nil {
			t.Fatal(err)
		}
		r, err := srv.Export(ctx, 256<<10, vconn.AccessRead|vconn.AccessWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.SendMsgImm(ctx, nil, r.ID()); err != nil {
			t.Fatal(err)
		}
		m, err := c.RecvMsg(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		use := func(write, read func([]byte, int64) error) {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for i := 0; ; i++ {
				off := int64(i%4) * (64 << 10)
				err := write(buf, off)
				if err == nil {
					err = read(buf, off)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}
		wg.Add(2)
		go use(func(p []byte, off int64) error { return c.WriteRegion(ctx, m.Imm, uint64(off), p) },
			func(p []byte, off int64) error { return c.ReadRegion(ctx, m.Imm, uint64(off), p) })
		go use(func(p []byte, off int64) error { return r.WriteAt(ctx, p, off) },
			func(p []byte, off int64) error { return r.ReadAt(ctx, p, off) })
		time.Sleep(20 * time.Millisecond)
		t.Logf("round %d: closing %s", round, map[bool]string{true: "the region", false: "the vconn"}[round%2 == 0])
		if round%2 == 0 {
			err = r.Close(ctx)
		} else {
			err = srv.Close()
		}
		if err != nil {
			t.Fatalf("round %d: close: %v", round, err)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: a region user did not stop after the close", round)
		}
		close(errs)
		for err := range errs {
			if !gone(err) {
				t.Errorf("round %d: a user ended with %v, not an error saying the region or vconn is gone", round, err)
			}
		}
		_ = c.Close()
		_ = srv.Close()
	}
	for i, c := range bystanders {
		if err := c.SendMsg(ctx, []byte("still here")); err != nil {
			t.Fatalf("bystander %d: %v", i, err)
		}
		if m, err := c.RecvMsg(ctx); err != nil || string(m.Data) != "still here" {
			t.Fatalf("bystander %d: %q, %v", i, m.Data, err)
		}
	}
}

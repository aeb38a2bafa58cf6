package demo

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// fakeAdmin answers createAllocation as an agent whose rails are down for
// the first downFor requests, then with an allocation.
func fakeAdmin(t *testing.T, downFor int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, admin.MaxMessage)
		for n := 0; ; n++ {
			if _, err := c.Read(buf); err != nil {
				return
			}
			rep := admin.Reply{Allocation: &admin.Allocation{ID: "demo", VConns: 4, Socket: "/x"}}
			if n < downFor {
				rep = admin.Reply{Code: admin.CodeUnavailable, Error: "agent: allocation demo: every rail of node n is down (rail 0 (soft-10.99.0.1): port DOWN)"}
			}
			b, _ := json.Marshal(rep)
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	return path
}

// A node whose link comes up a moment after its agent started gets its
// allocation once the rail is up, rather than failing at once.
func TestCreateAllocationWaitsForRail(t *testing.T) {
	ctx := context.Background()
	ac, err := admin.Dial(ctx, fakeAdmin(t, 3))
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	al, err := createAllocation(ctx, ac, 4)
	if err != nil || al.ID != "demo" {
		t.Fatalf("createAllocation across 3 refusals for a rail down: %+v, %v", al, err)
	}
	// A rail that never comes up fails within the caller's bound, saying why.
	ac2, err := admin.Dial(ctx, fakeAdmin(t, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer ac2.Close()
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := createAllocation(short, ac2, 4); !errors.Is(err, admin.ErrUnavailable) {
		t.Fatalf("createAllocation with the rail down for good: %v, want ErrUnavailable", err)
	}
}

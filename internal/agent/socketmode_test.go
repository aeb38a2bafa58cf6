package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// TestAllocationSocketOwner: an allocation's socket is mode 0660, owned by
// the configured user and group, in a directory others cannot list, and a
// client still connects through it.
func TestAllocationSocketOwner(t *testing.T) {
	// Giving a file away takes CAP_CHOWN; without it, the test's own ids
	// still show the configured ones are applied.
	uid, gid := os.Getuid(), os.Getgid()
	if os.Geteuid() == 0 {
		uid, gid = 4242, 4243
	}
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 10, TuneConfig: func(c *config.AgentConfig) {
		c.SocketUID, c.SocketGID = uid, gid
	}})
	n := cl.Nodes[0]
	ctx := ctxT(t)
	ac, err := admin.Dial(ctx, n.Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	al, err := ac.CreateAllocation(ctx, "owned", 2)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(al.Socket)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o660 || int(st.Uid) != uid || int(st.Gid) != gid {
		t.Errorf("socket mode %v owner %d:%d, want 0660 %d:%d", fi.Mode().Perm(), st.Uid, st.Gid, uid, gid)
	}
	if di, err := os.Stat(filepath.Dir(filepath.Dir(al.Socket))); err != nil || di.Mode().Perm() != 0o711 {
		t.Errorf("directory of allocations: %v, %v; want mode 0711 (not listable)", di, err)
	}
	c, err := n.Client(context.Background(), "owned-client", 1)
	if err != nil {
		t.Fatalf("a client of an owned socket: %v", err)
	}
	_ = c.Close()
}

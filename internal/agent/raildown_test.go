package agent_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/poll"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// TestRailDown: node-a's rails report the port state a test sets
// (verbstest.PortDevice over the soft devices). When rail 1's port goes
// DOWN, the status says so and why, an allocation asked on rail 1 is
// refused saying why, one asked without a rail goes on rail 0, rail 0's
// vconns keep working and the agent stays ready; rail_up says which rail
// is down. A device that disappears is down with the query's error. With
// rail 0 down too nothing is allocated, saying why; with rail 0 alone
// down the default is rail 1. Back ACTIVE, rail 1 is allocatable and
// carries vconns again.
func TestRailDown(t *testing.T) {
	var mu sync.Mutex
	var ports []*verbstest.PortDevice // node-a's rails
	cl := startCluster(t, agenttest.Options{TuneConfig: twoRails, TuneAgent: func(o *agent.Options) {
		o.RailCheckInterval = 10 * time.Millisecond
		if o.Config.NodeName != "node-a" {
			return
		}
		open := o.OpenRails
		o.OpenRails = func(c *config.AgentConfig) ([]verbs.Device, error) {
			devs, err := open(c)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			ports = nil
			for i, d := range devs {
				p := verbstest.WithPort(d)
				ports, devs[i] = append(ports, p), p
			}
			return devs, nil
		}
	}})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	mu.Lock()
	rail0, rail1 := ports[0], ports[1]
	mu.Unlock()
	ac, err := admin.Dial(ctx, a.Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	downs := func() []string {
		var out []string
		for _, r := range a.Agent.Status().Rails {
			out = append(out, r.Down)
		}
		return out
	}
	waitDown := func(what string, want0, want1 func(string) bool) {
		t.Helper()
		poll.Until(t, 10*time.Second, what, func() bool { d := downs(); return want0(d[0]) && want1(d[1]) })
	}
	up := func(s string) bool { return s == "" }
	is := func(want string) func(string) bool { return func(s string) bool { return s == want } }
	railUp := func(rail, dev string) float64 {
		return gather(t, a.Agent.Collector())[`rdmavisor_rail_up{device="`+dev+`",rail="`+rail+`"}`]
	}

	if d := downs(); len(d) != 2 || d[0] != "" || d[1] != "" {
		t.Fatalf("rails down at start: %q", d)
	}
	serveEcho(ctx, t, railClient(t, b, "srv", 0), "9")
	c0 := railClient(t, a, "cli0", 0)
	echo(ctx, t, c0, "9", "before")

	rail1.SetPortState(verbs.PortStateDown)
	waitDown("rail 1 down", up, is("port DOWN"))
	if _, err := ac.Create(ctx, admin.Allocation{ID: "on1", VConns: 1, Rail: 1}); err == nil ||
		!strings.Contains(err.Error(), "rail 1 (soft-127.0.0.4) is down: port DOWN") {
		t.Errorf("an allocation on rail 1, down: %v; want a refusal naming the rail and why", err)
	}
	if al, err := ac.Create(ctx, admin.Allocation{ID: "dflt", VConns: 1}); err != nil || al.Rail != 0 {
		t.Errorf("an allocation without a rail, rail 1 down: rail %d, %v; want rail 0", al.Rail, err)
	}
	echo(ctx, t, c0, "9", "rail 1 down")
	if !a.Agent.Ready() || !a.Agent.Status().Ready {
		t.Error("the agent is not ready with one of its two rails down")
	}
	if r0, r1 := railUp("0", "soft-127.0.0.2"), railUp("1", "soft-127.0.0.4"); r0 != 1 || r1 != 0 {
		t.Errorf("rdmavisor_rail_up: rail 0 %v, rail 1 %v; want 1, 0", r0, r1)
	}

	gone := errors.New("ibv: query port 1 of mlx5_1: no such device")
	rail1.Unplug(gone)
	waitDown("rail 1 gone", up, is("port query failed: "+gone.Error()))

	rail0.SetPortState(verbs.PortStateInit)
	waitDown("both rails down", is("port INIT"), is("port query failed: "+gone.Error()))
	if _, err := ac.Create(ctx, admin.Allocation{ID: "none", VConns: 1}); !errors.Is(err, admin.ErrUnavailable) ||
		!strings.Contains(err.Error(), "every rail of node node-a is down (rail 0 (soft-127.0.0.2): port INIT; rail 1 (soft-127.0.0.4): port query failed") {
		t.Errorf("an allocation with every rail down: %v; want a refusal saying why, to retry (ErrUnavailable)", err)
	}

	rail1.SetPortState(verbs.PortStateNOP) // the soft device's own state: ACTIVE
	waitDown("rail 1 back, rail 0 down", is("port INIT"), up)
	if al, err := ac.Create(ctx, admin.Allocation{ID: "dflt1", VConns: 1}); err != nil || al.Rail != 1 {
		t.Errorf("an allocation without a rail, rail 0 down: rail %d, %v; want rail 1", al.Rail, err)
	}
	rail0.SetPortState(verbs.PortStateActiveDefer) // active, its link briefly interrupted
	waitDown("both rails back", up, up)
	echo(ctx, t, railClient(t, a, "cli1", 1), "9", "rail 1 back")
	if r0, r1 := railUp("0", "soft-127.0.0.2"), railUp("1", "soft-127.0.0.4"); r0 != 1 || r1 != 1 {
		t.Errorf("rdmavisor_rail_up: rail 0 %v, rail 1 %v; want 1, 1", r0, r1)
	}
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
)

// Issue 33 on the real cluster (internal/agent's
// TestAPIPodIPsOutrankAnnouncements on two in-process agents): a node
// holding a valid certificate of the cluster CA's announces a live pod's
// IP, and every other IP of its /16, to every agent, through a rolling
// restart of the agents. Before the agents took pod IPs from the API
// server, the victim's node's agent restarting dropped its announcement at
// its peers, and their dials of its pods went to the announcer.

// rogueAnnouncer: node-x announces the IP of a live pod on the server's
// node, B, and the 65,535 other IPs of its /16, to every agent, again and
// again; clients on the two other nodes dial that pod, one exchange after
// another, before, during and after a rolling restart of every agent
// (kubectl rollout restart), B's among them. Every agent, old and new,
// refuses node-x's announcements (no RDMANode of the service lists it) and
// never calls it; every byte a client got back was its own, and B's
// server echoed at least as many messages as the clients got; an exchange
// fails only across a restart of its agents, its client told; after the
// roll both other nodes' clients succeed; when node-x stops, no RDMANode
// reports it unreachable and the service stays Ready.
func (e *env) rogueAnnouncer() {
	to := e.serverNode()
	_, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "echo-server", metav1.GetOptions{})
	restore := err == nil // the roll ends its program: made again after
	x := e.startExchangePods(goEcho)
	nx := e.startNodeX()
	ctx, cancel := context.WithCancel(e.ctx)
	var bg sync.WaitGroup
	// Stopped before the step ends, whichever way: they run kubectl.
	defer func() {
		cancel()
		bg.Wait()
		nx.stop()
		for _, n := range e.nodes {
			e.deletePod(x.pods[n])
		}
	}()
	bg.Go(func() { x.serve(ctx, to) })
	e.eventually("the live pod's server listening on "+to, 2*time.Minute, func() (bool, string) {
		s := x.state()[to]
		return s.server.listen && s.podIP != "", fmt.Sprintf("%+v", s)
	})
	s0 := x.state()[to]
	claim, err := claimAround(s0.podIP)
	if err != nil {
		e.t.Fatal(err)
	}
	agents := e.controlAddresses()
	e.announceAsRefused(nx, agents[e.clientNode()], to, claim)
	start := time.Now()
	bg.Go(func() { nx.announce(ctx, agents, claim) })
	e.eventually("every agent refused node-x's announcement of "+s0.podIP+" and 65,535 more", time.Minute, nx.refusedSince(start, e.nodes))

	r := &rogueDials{x: x, to: to, ip: s0.podIP}
	dctx, stopDials := context.WithCancel(ctx)
	var dials sync.WaitGroup
	defer func() { stopDials(); dials.Wait() }()
	// Two dialling loops on each node: more dials fall in B's agent's
	// outage, a few seconds.
	for _, n := range e.otherNodes() {
		dials.Go(func() { r.run(dctx, n) })
		dials.Go(func() { r.run(dctx, n) })
	}
	r.waitFor(beforeRoll, 3)
	e.eventually("every agent ready before the roll", 2*time.Minute, e.agentReady)
	r.phase.Store(inRoll)
	took, outage := e.restartAgents(to)
	e.eventually("the live pod's server listening again through its new agent", 2*time.Minute, func() (bool, string) {
		s := x.state()[to]
		return s.server.listen && s.server.run > s0.server.run, fmt.Sprintf("%+v", s)
	})
	rolled := time.Now()
	e.eventually("every new agent refused node-x's announcement", time.Minute, nx.refusedSince(rolled, e.nodes))
	r.phase.Store(afterRoll)
	r.waitFor(afterRoll, 3)
	stopDials()
	dials.Wait()
	r.echoedAll()
	r.check(nx, took, outage)
	cancel()
	bg.Wait()
	e.forgetNodeX(x, nx, restore)
}

// forgetNodeX stops node-x and the step's pods, and leaves the service as
// the next step expects: Ready, the echo server listening (if it was),
// the step's allocations released. Node-x stopped, no RDMANode may list
// it unreachable. Before the agents refused an outsider's announcements,
// they kept node-x as a peer, listed it unreachable once it stopped, and
// the operator set the service NotReady ("node node-x unreachable from
// node-1, node-2, node-3").
func (e *env) forgetNodeX(x *exchanger, nx *nodeX, restore bool) {
	for _, n := range e.nodes {
		e.deletePod(x.pods[n])
	}
	nx.stop()
	for _, n := range e.nodes {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: n}, &rn); err != nil {
			e.t.Fatal(err)
		}
		if slices.Contains(rn.Status.UnreachablePeers, nodeXName) {
			e.t.Errorf("RDMANode %s lists node-x, no node of the service, among its unreachable peers", n)
		}
	}
	if restore {
		e.deletePod("echo-server")
		e.startServerAfterRestart()
	}
	// The step's pods' allocations released, as the next step expects.
	for _, n := range e.nodes {
		e.allocationsBackTo(n, e.liveAllocations(n))
	}
}

// echoedAll: B's server echoed as many messages as the clients got back
// (it logs each vconn's count as it ends): the echoes came from it.
func (r *rogueDials) echoedAll() {
	e, x := r.x.e, r.x
	delivered := r.delivered()
	e.eventually("the live pod's server echoed every message the clients got back", 30*time.Second, func() (bool, string) {
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.echoed[r.to] >= delivered, fmt.Sprintf("echoed %d, delivered %d", x.echoed[r.to], delivered)
	})
	x.mu.Lock()
	defer x.mu.Unlock()
	e.t.Logf("messages the clients got back, every byte checked: %d; the server on %s echoed %d", delivered, r.to, x.echoed[r.to])
}

// announceAsRefused: node-x, announcing under node as's name to the agent
// at addr, is refused: its certificate is node-x's.
func (e *env) announceAsRefused(nx *nodeX, addr, as string, claim [][]byte) {
	cl, closeConn, err := nx.dial(addr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	_, err = cl.Announce(ctx, &controlpb.Announcement{Caller: nx.self(as), PodIps: claim})
	if status.Code(err) != codes.PermissionDenied {
		e.t.Fatalf("node-x announcing as %s to the agent at %s: %v, want PermissionDenied", as, addr, err)
	}
}

// restartAgents restarts every agent, a node at a time (kubectl rollout
// restart of their DaemonSet), waits until each node has a new one, ready,
// and the service Ready, and returns how long that took, and how long node had no ready agent
// (polled; 0 if no poll fell in it).
func (e *env) restartAgents(node string) (took, outage time.Duration) {
	old := map[string]types.UID{}
	for _, n := range e.nodes {
		old[n] = e.agentPod(n).UID
	}
	began := time.Now()
	e.run(e.kubectl, "rollout", "restart", "-n", namespace, "daemonset/rdmavisor-agent-"+e.svc.Name)
	var down, up time.Time
	e.eventually("every node's agent restarted and ready", 5*time.Minute, func() (bool, string) {
		now := time.Now()
		ready := map[string]types.UID{}
		for _, p := range e.agentPods() {
			if p.DeletionTimestamp == nil && podReady(&p) {
				ready[p.Spec.NodeName] = p.UID
			}
		}
		switch u, ok := ready[node]; {
		case !ok && down.IsZero():
			down = now
		case ok && u != old[node] && !down.IsZero() && up.IsZero():
			up = now
		}
		for _, n := range e.nodes {
			if u, ok := ready[n]; !ok || u == old[n] {
				return false, fmt.Sprintf("%s: ready agent %q (the old one %s)", n, u, old[n])
			}
		}
		return e.agentReady()
	})
	if !up.IsZero() {
		outage = up.Sub(down)
	}
	return time.Since(began), outage
}

// The phases of the roll an exchange begins and ends in.
const (
	beforeRoll int32 = iota
	inRoll
	afterRoll
)

// rogueDials runs exchanges from the exchange pods of the other nodes to
// the live pod, ip on node to, one after another from each, and keeps what
// each found and in which phases of the roll it began and ended.
type rogueDials struct {
	x     *exchanger
	to    string
	ip    string
	phase atomic.Int32

	mu   sync.Mutex
	done []rogueExchange
}

type rogueExchange struct {
	exchange
	began, ended int32
}

// run dials from node from until ctx ends.
func (r *rogueDials) run(ctx context.Context, from string) {
	for ctx.Err() == nil {
		ex := rogueExchange{exchange: exchange{from: from, to: r.to, before: r.x.state()}, began: r.phase.Load()}
		ex.v, ex.err = r.x.e.execClient(r.x.pods[from], r.ip)
		if ctx.Err() != nil {
			return // cut short: not an exchange
		}
		ex.after, ex.ended = r.x.state(), r.phase.Load()
		r.mu.Lock()
		r.done = append(r.done, ex)
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitFor waits until each dialling node has n exchanges begun in phase.
func (r *rogueDials) waitFor(phase int32, n int) {
	e := r.x.e
	e.eventually(fmt.Sprintf("%d exchanges from each node in phase %d", n, phase), 3*time.Minute, func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		got := map[string]int{}
		for _, ex := range r.done {
			if ex.began == phase {
				got[ex.from]++
			}
		}
		for _, from := range e.otherNodes() {
			if got[from] < n {
				return false, fmt.Sprintf("%v", got)
			}
		}
		return true, ""
	})
}

// when says the exchange's part of the roll: before, during, after.
func (ex rogueExchange) when() string {
	switch {
	case ex.began == beforeRoll && ex.ended == beforeRoll:
		return "before"
	case ex.began == afterRoll:
		return "after"
	}
	return "during"
}

// inOutage: the live pod's node had no ready agent when the exchange
// began or ended, or a new one at its end.
func (ex rogueExchange) inOutage() bool {
	b, a := ex.before[ex.to].agent, ex.after[ex.to].agent
	return b == "" || a == "" || a != b
}

func (ex rogueExchange) String() string {
	return fmt.Sprintf("%s → %s (%s the roll, over %s's agent's outage %v, stable %v): sent %d, delivered %d, failed %d, vanished %d, duplicated %d, reordered %d, corrupt %d: %s",
		ex.from, ex.to, ex.when(), ex.to, ex.inOutage(), ex.stable(), ex.v.Sent, ex.v.Delivered, ex.v.Failed, ex.v.Vanished,
		ex.v.Duplicated, ex.v.Reordered, ex.v.Corrupt, ex.err)
}

// rogueTally counts the exchanges of one part of the roll: all, those
// that succeeded, those that failed with their clients told, and of all
// those over the live pod's node's agent's outage (inOutage), and how
// many of those succeeded.
type rogueTally struct{ n, ok, told, outage, outageOK int }

// delivered is the messages the clients got back, every byte checked.
func (r *rogueDials) delivered() (n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ex := range r.done {
		n += ex.v.Delivered
	}
	return n
}

// check fails the step for a call at node-x only a dial makes, or none
// from the agents at all (then the count says nothing), a message lost or
// mangled unannounced, an exchange that failed with no agent of its
// restarting or failed unsaid, no exchange over the live pod's node's
// agent's outage, or a node whose clients did not all succeed after the
// roll; and logs and records the figures.
func (r *rogueDials) check(nx *nodeX, took, outage time.Duration) {
	e := r.x.e
	r.mu.Lock()
	defer r.mu.Unlock()
	tally := map[string]*rogueTally{"before": {}, "during": {}, "after": {}}
	for _, ex := range r.done {
		t := tally[ex.when()]
		t.n++
		if ex.v.Vanished+ex.v.Duplicated+ex.v.Reordered+ex.v.Corrupt > 0 {
			e.t.Errorf("messages lost or mangled without an error: %s", ex)
		}
		if ex.inOutage() {
			t.outage++
			if ex.v.OK {
				t.outageOK++
			}
		}
		switch {
		case ex.v.OK:
			t.ok++
		case ex.err == "":
			e.t.Errorf("an exchange failed and its client said nothing: %s", ex)
		case ex.when() != "during" || ex.stable():
			e.t.Errorf("an exchange %s the roll, no agent of its restarting, failed: %s", ex.when(), ex)
		default:
			t.told++
			e.t.Logf("failed during the roll: %s", ex)
		}
	}
	peer, dial, calls := nx.calledBy()
	if dial != 0 {
		e.t.Errorf("calls at node-x that only a dial routed there makes: %d (all its calls by method: %v), want 0", dial, calls)
	}
	if peer != 0 {
		e.t.Errorf("calls at node-x that an agent makes of a peer it keeps: %d (%v), want 0: no agent takes it for one", peer, calls)
	}
	taken := nx.announcementsTaken()
	for n, k := range taken {
		if k != 0 {
			e.t.Errorf("the agents on %s took %d of node-x's announcements, want 0", n, k)
		}
	}
	if d := tally["during"]; d.outage == 0 {
		e.t.Errorf("no exchange ran over %s's agent's outage: %d exchanges during the roll", r.to, d.n)
	}
	for _, when := range []string{"before", "after"} {
		if t := tally[when]; t.n == 0 || t.ok != t.n {
			e.t.Errorf("exchanges %s the roll: %d, %d of them successful, want all", when, t.n, t.ok)
		}
	}
	b, d, a := tally["before"], tally["during"], tally["after"]
	e.t.Logf("node-x's announcement of %s and 65,535 more, through a rolling restart of every agent (%s; %s without a ready agent %s): "+
		"exchanges from %v before the roll %d (%d successful), during %d (%d successful, %d failed with their clients told; %d over %s's agent's outage, %d of them successful), after %d (%d successful); "+
		"calls reaching node-x: %d that a dial would make, %d that an agent makes of a peer (%v); announcements taken %v",
		r.ip, took.Round(100*time.Millisecond), r.to, outage.Round(100*time.Millisecond), e.otherNodes(), b.n, b.ok, d.n, d.ok, d.told, d.outage, r.to, d.outageOK, a.n, a.ok, dial, peer, calls, taken)
	e.measured("a rogue node announcing a live pod's IP (and 65,535 more) through a rolling agent restart: exchanges before, during, after the roll",
		"%d, %d (%d failed, their clients told; %d over the pod's node's agent's outage), %d; every delivered byte checked", b.n, d.n, d.told, d.outage, a.n)
	e.measured("a rogue node announcing a live pod's IP through a rolling agent restart: dials reaching the rogue node", "%d", dial)
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The upgrade from the previous release (hack/previous-release): its chart
// and images, which hack/prev-images.sh builds and imports (tagged :prev;
// the chart's directory in E2E_PREV_CHART), installed first; then this
// release's, with helm upgrade, while a pod on every node exchanges
// messages with the pods on every other, every byte checked.

const (
	prevTag       = "prev"
	prevEchoImage = "local.test/rdmavisor-echo:" + prevTag
	prevAgent     = "local.test/rdmavisor:" + prevTag
	newAgent      = "local.test/rdmavisor:dev"
	upgradeLabel  = "rdmavisor-e2e-upgrade"
)

// helmInstallPrevious installs the previous release's chart, its images.
func (e *env) helmInstallPrevious() {
	chart := os.Getenv("E2E_PREV_CHART")
	if chart == "" {
		e.t.Fatal("E2E_PREV_CHART is not set: run the suite with hack/e2e.sh, which builds the previous release (hack/prev-images.sh)")
	}
	e.helmInstallChart(chart, prevTag)
}

// applyPreviousService applies the sample with no agent image, so its
// agents run the operator's own (the previous release's, until helm
// upgrade changes the operator), and checks they do.
func (e *env) applyPreviousService() {
	svc := e.svc.DeepCopy()
	svc.Spec.Agent.Image = ""
	e.applyRDMAService(svc)
	for _, p := range e.agentPods() {
		if img := agentImage(&p); img != prevAgent {
			e.t.Fatalf("agent pod %s on %s runs %s, want the previous release's %s", p.Name, p.Spec.NodeName, img, prevAgent)
		}
	}
}

// agentImage is the image of an agent pod's agent container.
func agentImage(p *corev1.Pod) string {
	for _, c := range p.Spec.Containers {
		if c.Name == "agent" {
			return c.Image
		}
	}
	return ""
}

// upgradeFromPrevious: on every node an echo server and a client pod
// (which holds its allocation and runs the exchanges' clients), both of
// the previous release's image; exchanges between every ordered pair of
// nodes, round after round, while the CRDs are applied and helm upgrade
// moves the operator to this release, which rolls the agents. A server
// whose agent went ends (the old program does not listen again), and is
// made anew, as its controller would. Checked: no message lost
// unannounced, ever; every exchange between two nodes whose agents and
// pods stayed up succeeds, old agent with new included, both ways; at the
// end every agent and the operator run this release, and the old pods'
// library works with them. Measured: each node's outage, the exchanges
// and messages that failed (their clients told).
func (e *env) upgradeFromPrevious() {
	x := &exchanger{e: e}
	for _, n := range e.nodes {
		if err := x.createServer(n); err != nil {
			e.t.Fatal(err)
		}
	}
	e.eventually("the upgrade servers listening", 2*time.Minute, func() (bool, string) { return x.allServing() })
	for _, n := range e.nodes {
		x.createHolder(n)
	}
	e.eventually("the upgrade clients running", 2*time.Minute, func() (bool, string) {
		s := e.upgradeState()
		for _, n := range e.nodes {
			if s[n].holder == "" {
				return false, fmt.Sprintf("%s: %+v", n, s[n])
			}
		}
		return true, ""
	})
	if bad := x.sweep(); len(bad) > 0 {
		e.t.Fatalf("before the upgrade, between the previous release's agents:\n%s", strings.Join(bad, "\n"))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { x.run(stop) })
	// Stopped before the step ends, whichever way: the exchanges log.
	var once sync.Once
	stopExchanges := func() { once.Do(func() { close(stop); wg.Wait() }) }
	defer stopExchanges()
	began := time.Now()
	e.run(e.kubectl, "apply", "--server-side", "-f", "charts/rdmavisor/crds/")
	e.run(e.helm, "upgrade", release, "charts/rdmavisor", "--namespace", namespace,
		"--reset-then-reuse-values", "--set", "image.tag=dev")
	outage := e.waitUpgraded(began)
	took := time.Since(began)
	// The servers whose agents rolled are made anew: go on until every
	// one listens and two whole rounds have run between the new agents.
	e.eventually("every upgrade server listening again", 2*time.Minute, func() (bool, string) { return x.allServing() })
	x.waitRounds(2)
	stopExchanges()
	if bad := x.sweep(); len(bad) > 0 {
		e.t.Errorf("after the upgrade, the previous release's pods through this release's agents:\n%s", strings.Join(bad, "\n"))
	}
	x.check()
	var outages []string
	for _, n := range e.nodes {
		outages = append(outages, fmt.Sprintf("%s %s", n, outage[n].Round(100*time.Millisecond)))
	}
	e.t.Logf("upgrade: %s from helm upgrade to every agent of this release ready; outages %s", took.Round(100*time.Millisecond), strings.Join(outages, ", "))
	e.measured("upgrade from the previous release: from helm upgrade to every agent upgraded and ready", "%s", took.Round(100*time.Millisecond))
	e.measured("upgrade from the previous release: each node without a ready agent", "%s", strings.Join(outages, ", "))
	x.measure()
	pods, err := e.kube.CoreV1().Pods("default").List(e.ctx, metav1.ListOptions{LabelSelector: "app=" + upgradeLabel})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		e.deletePod(p.Name)
	}
	for _, n := range e.nodes {
		e.allocationsBackTo(n, nil)
	}
}

// nodeState is what an exchange depends on, on one node: its agent pod
// (the ready one not being deleted), and the upgrade's server and client
// pods there (the newest of each not being deleted).
type nodeState struct {
	agent    string // the ready agent pod's UID; "" when none is
	image    string // its image
	server   string // the server pod's name, ready; "" when none is
	serverIP string
	ended    string // a server pod that ended, to be made anew
	holder   string // the client pod's name, running; "" when none is
	restarts int32  // the client pod's restarts
}

// upgradeState is every node's nodeState now; a node whose pods cannot be
// listed is not ready.
func (e *env) upgradeState() map[string]nodeState {
	s := map[string]nodeState{}
	agents, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + agentApp})
	if err != nil {
		return s
	}
	pods, err := e.kube.CoreV1().Pods("default").List(e.ctx, metav1.ListOptions{LabelSelector: "app=" + upgradeLabel})
	if err != nil {
		return s
	}
	for _, p := range agents.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			st := s[p.Spec.NodeName]
			st.agent, st.image = string(p.UID), agentImage(&p)
			s[p.Spec.NodeName] = st
		}
	}
	for _, p := range pods.Items {
		st := s[p.Spec.NodeName]
		switch {
		case p.DeletionTimestamp != nil:
		case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
			if p.Labels["role"] == "server" {
				st.ended = p.Name
			}
		case p.Labels["role"] == "server" && podReady(&p):
			st.server, st.serverIP = p.Name, p.Status.PodIP
		case p.Labels["role"] == "client" && p.Status.Phase == corev1.PodRunning:
			st.holder = p.Name
			for _, c := range p.Status.ContainerStatuses {
				st.restarts += c.RestartCount
			}
		}
		s[p.Spec.NodeName] = st
	}
	return s
}

// waitUpgraded waits until the operator and every node's agent run this
// release, ready, and returns how long each node was without a ready
// agent (polled every 250 ms from began).
func (e *env) waitUpgraded(began time.Time) map[string]time.Duration {
	down := map[string]time.Time{}
	outage := map[string]time.Duration{}
	deadline := began.Add(6 * time.Minute)
	for {
		now := time.Now()
		s := e.upgradeState()
		done := true
		for _, n := range e.nodes {
			switch st := s[n]; {
			case st.agent == "":
				done = false
				if _, ok := down[n]; !ok {
					down[n] = now
				}
			case st.image != newAgent:
				done = false
			default:
				if t, ok := down[n]; ok && outage[n] == 0 {
					outage[n] = now.Sub(t)
				}
			}
		}
		if done && e.operatorRuns(newAgent) {
			return outage
		}
		if now.After(deadline) {
			e.t.Fatalf("every agent and the operator on %s: not within 6m0s of helm upgrade: %+v", newAgent, s)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// operatorRuns says whether the operator's Deployment has rolled to
// image, every replica ready.
func (e *env) operatorRuns(image string) bool {
	l, err := e.kube.AppsV1().Deployments(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
	if err != nil || len(l.Items) != 1 {
		return false
	}
	d := l.Items[0]
	c := d.Spec.Template.Spec.Containers
	return len(c) > 0 && c[0].Image == image && d.Status.ObservedGeneration == d.Generation &&
		d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.ReadyReplicas == *d.Spec.Replicas &&
		d.Status.Replicas == *d.Spec.Replicas
}

// exchanger runs echo exchanges between the upgrade's pods, every
// ordered pair of nodes at once, round after round, and keeps what each
// found.
type exchanger struct {
	e *env

	mu     sync.Mutex
	rounds int
	made   int // pods made, for their names
	done   []exchange
}

// upgradePod is a pod of the previous release's echo image on node, of
// role server or client.
func (x *exchanger) upgradePod(role, node string, args ...string) *corev1.Pod {
	x.mu.Lock()
	x.made++
	name := fmt.Sprintf("upgrade-%s-%d", role, x.made)
	x.mu.Unlock()
	prev := app{lang: "go", image: prevEchoImage, exe: goEcho.exe}
	p := x.e.appPod(prev, name, node, 4, args...)
	p.Labels = map[string]string{"app": upgradeLabel, "role": role}
	return p
}

// createServer makes node's echo server; it does not stop its test's step
// (it runs beside the step, in the exchanger).
func (x *exchanger) createServer(node string) error {
	p := x.upgradePod("server", node, "server", fmt.Sprintf("--port=%d", echoPort), "--ready=/dev/termination-log")
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: append(append([]string(nil), goEcho.exe...), "show", "/dev/termination-log")}}}
	_, err := x.e.kube.CoreV1().Pods("default").Create(x.e.ctx, p, metav1.CreateOptions{})
	return err
}

// createHolder makes node's client pod: one exchange with its own node's
// server, then it holds its allocation, through which the exchanges'
// clients run (kubectl exec), whatever its agent does.
func (x *exchanger) createHolder(node string) {
	s := x.e.upgradeState()
	p := x.upgradePod("client", node, "client", fmt.Sprintf("--addr=%s:%d", s[node].serverIP, echoPort),
		"--conns=1", "--messages=1", "--hold")
	x.e.createPod(p)
}

// allServing says whether every node has a server listening.
func (x *exchanger) allServing() (bool, string) {
	s := x.e.upgradeState()
	for _, n := range x.e.nodes {
		if s[n].server == "" || s[n].serverIP == "" {
			return false, fmt.Sprintf("%s: %+v", n, s[n])
		}
	}
	return true, ""
}

// revive makes anew each server that ended (its agent went), as a
// Deployment would.
func (x *exchanger) revive() {
	s := x.e.upgradeState()
	for _, n := range x.e.nodes {
		if s[n].ended == "" {
			continue
		}
		err := x.e.kube.CoreV1().Pods("default").Delete(x.e.ctx, s[n].ended, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
		if err == nil {
			err = x.createServer(n)
		}
		if err != nil {
			x.e.t.Logf("making the server on %s anew: %v", n, err)
		}
	}
}

// exchange is one client's run from node from to node to: the states of
// the nodes before and after it, and the verdict its client wrote.
type exchange struct {
	from, to      string
	before, after map[string]nodeState
	v             verdict
	err           string // the client gave no verdict
}

// Each exchange: one vconn, 20 messages of 4 KiB, 4 in flight.
const (
	upgradeMessages = 20
	upgradeTimeout  = 8 * time.Second
)

func (x *exchanger) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		x.revive()
		x.sweep()
		time.Sleep(300 * time.Millisecond)
	}
}

// sweep runs one round, every ordered pair at once, and says which
// exchanges did not succeed.
func (x *exchanger) sweep() []string {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for _, from := range x.e.nodes {
		for _, to := range x.e.nodes {
			if from == to {
				continue
			}
			wg.Go(func() {
				ex := x.one(from, to)
				if !ex.v.OK {
					mu.Lock()
					bad = append(bad, ex.String())
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	x.mu.Lock()
	x.rounds++
	x.mu.Unlock()
	slices.Sort(bad)
	return bad
}

// waitRounds waits until n more rounds have ended.
func (x *exchanger) waitRounds(n int) {
	x.mu.Lock()
	want := x.rounds + n
	x.mu.Unlock()
	x.e.eventually(fmt.Sprintf("%d more rounds of exchanges", n), 2*time.Minute, func() (bool, string) {
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.rounds >= want, fmt.Sprintf("%d rounds", x.rounds)
	})
}

// one runs a client in from's client pod against to's server and records
// what it found; an exchange that cannot start is not recorded.
func (x *exchanger) one(from, to string) exchange {
	e := x.e
	ex := exchange{from: from, to: to, before: e.upgradeState()}
	if ex.before[from].holder == "" || ex.before[to].server == "" {
		// Nothing to run from, or nothing listens there (its server is
		// being made anew): no exchange.
		ex.err = fmt.Sprintf("not run: %s's client pod %q, %s's server %q", from, ex.before[from].holder, to, ex.before[to].server)
		return ex
	}
	ctx, cancel := context.WithTimeout(e.ctx, upgradeTimeout+20*time.Second)
	defer cancel()
	args := append(append([]string{"exec", "-n", "default", ex.before[from].holder, "-c", "echo", "--"}, goEcho.exe...),
		"client", fmt.Sprintf("--addr=%s:%d", ex.before[to].serverIP, echoPort), "--conns=1",
		fmt.Sprintf("--messages=%d", upgradeMessages), "--size=4096", "--window=4",
		fmt.Sprintf("--timeout=%s", upgradeTimeout), "--verdict=/dev/stdout")
	out, _ := exec.CommandContext(ctx, e.kubectl, args...).CombinedOutput()
	ex.after = e.upgradeState()
	ex.err = strings.TrimSpace(string(out))
	// The verdict's JSON has no newline of its own: the summary follows it.
	if i := strings.Index(string(out), `{"ok":`); i >= 0 && json.NewDecoder(strings.NewReader(string(out[i:]))).Decode(&ex.v) == nil {
		ex.err = ""
	}
	if ex.err == "" && !ex.v.OK {
		ex.err = ex.v.Error
	}
	x.mu.Lock()
	x.done = append(x.done, ex)
	x.mu.Unlock()
	return ex
}

// stable says whether both nodes' agents, the dialling node's client pod
// and the other's server stayed up, the same pods and containers, over
// the exchange: then it must succeed.
func (ex exchange) stable() bool {
	b, a := ex.before, ex.after
	for _, n := range []string{ex.from, ex.to} {
		if b[n].agent == "" || a[n].agent != b[n].agent {
			return false
		}
	}
	return b[ex.from].holder != "" && a[ex.from].holder == b[ex.from].holder && a[ex.from].restarts == b[ex.from].restarts &&
		b[ex.to].server != "" && a[ex.to].server == b[ex.to].server
}

// versions says which releases' agents the exchange went between, as
// "old→new", from the dialling node's.
func (ex exchange) versions() string {
	rel := func(n string) string {
		if ex.before[n].image == newAgent {
			return "new"
		}
		return "old"
	}
	return rel(ex.from) + "→" + rel(ex.to)
}

func (ex exchange) String() string {
	return fmt.Sprintf("%s → %s (%s agents, stable %v): sent %d, delivered %d, failed %d, vanished %d, duplicated %d, reordered %d, corrupt %d: %s",
		ex.from, ex.to, ex.versions(), ex.stable(), ex.v.Sent, ex.v.Delivered, ex.v.Failed, ex.v.Vanished,
		ex.v.Duplicated, ex.v.Reordered, ex.v.Corrupt, ex.err)
}

// check fails the step for a message lost unannounced, a stable exchange
// that failed, or no stable exchange between an old and a new agent in
// either direction.
func (x *exchanger) check() {
	x.mu.Lock()
	defer x.mu.Unlock()
	mixed := map[string]int{}
	for _, ex := range x.done {
		if ex.v.Vanished+ex.v.Duplicated+ex.v.Reordered+ex.v.Corrupt > 0 {
			x.e.t.Errorf("messages lost or mangled without an error: %s", ex)
		}
		if !ex.stable() {
			continue
		}
		if !ex.v.OK {
			x.e.t.Errorf("an exchange between agents and servers that stayed up failed: %s", ex)
		}
		if v := ex.versions(); ex.v.OK && ex.after[ex.from].image == ex.before[ex.from].image && ex.after[ex.to].image == ex.before[ex.to].image {
			mixed[v]++
		}
	}
	for _, v := range []string{"old→new", "new→old"} {
		if mixed[v] == 0 {
			x.e.t.Errorf("no exchange from an agent of the %s release to one of the %s succeeded while both stayed up (exchanges by agents: %v)",
				strings.Split(v, "→")[0], strings.Split(v, "→")[1], mixed)
		}
	}
	x.e.t.Logf("upgrade: %d exchanges; stable and successful by agents' releases: %v", len(x.done), mixed)
}

// measure records the exchanges, how many failed with their clients told,
// and the messages those lost.
func (x *exchanger) measure() {
	x.mu.Lock()
	defer x.mu.Unlock()
	var failed, messages, silent int64
	for _, ex := range x.done {
		silent += ex.v.Vanished + ex.v.Duplicated + ex.v.Reordered + ex.v.Corrupt
		if ex.v.OK {
			continue
		}
		failed++
		messages += ex.v.Sent - ex.v.Delivered
		x.e.t.Logf("failed while a node rolled: %s", ex)
	}
	x.e.measured("upgrade from the previous release: exchanges across the roll (20 messages of 4 KiB each)",
		"%d, %d of them failed with their clients told (%d messages sent and not echoed); lost or mangled unannounced: %d",
		len(x.done), failed, messages, silent)
}

//go:build e2e

package e2e

import (
	"bufio"
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

// upgradeFromPrevious: on every node a pod of the previous release's echo
// image holds an allocation, and runs, through kubectl exec, an echo
// server (made anew within moments when its agent's restart ends it, as a
// program that retries would be) and the clients of exchanges with every
// other node's, round after round, while the CRDs are applied and helm
// upgrade moves the operator to this release, which rolls the agents.
// Checked: no message lost unannounced, ever; every exchange between two
// nodes whose agents, pods and servers stayed up succeeds, old agent with
// new included, both ways; at the end every agent and the operator run
// this release, and the old pods' library works with them. Measured:
// each node's outage, the exchanges and messages that failed (their
// clients told).
func (e *env) upgradeFromPrevious() {
	x := e.startUpgradePods()
	ctx, cancel := context.WithCancel(e.ctx)
	var servers, rounds sync.WaitGroup
	// Stopped before the step ends, whichever way: they run kubectl.
	defer func() { cancel(); servers.Wait(); rounds.Wait() }()
	for _, n := range e.nodes {
		servers.Go(func() { x.serve(ctx, n) })
	}
	e.eventually("the upgrade servers listening", 2*time.Minute, x.allServing)
	if bad := x.sweep(); len(bad) > 0 {
		e.t.Fatalf("before the upgrade, between the previous release's agents:\n%s", strings.Join(bad, "\n"))
	}
	rounds.Go(func() { x.run(ctx) })
	began := time.Now()
	e.run(e.kubectl, "apply", "--server-side", "-f", "charts/rdmavisor/crds/")
	e.run(e.helm, "upgrade", release, "charts/rdmavisor", "--namespace", namespace,
		"--reset-then-reuse-values", "--set", "image.tag=dev")
	outage := e.waitUpgraded(began)
	took := time.Since(began)
	// Go on until every server listens again through its new agent and
	// two whole rounds have run between the new agents.
	e.eventually("every upgrade server listening again", 2*time.Minute, x.allServing)
	x.waitRounds(2)
	x.stop()
	rounds.Wait()
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
	cancel()
	servers.Wait()
	for _, n := range e.nodes {
		e.deletePod(x.pods[n])
	}
	for _, n := range e.nodes {
		e.allocationsBackTo(n, nil)
	}
}

// startUpgradePods makes on every node the pod the upgrade's servers and
// clients run in, of the previous release's echo image.
func (e *env) startUpgradePods() *exchanger {
	return e.startExchangePods(app{lang: "go", image: prevEchoImage, exe: goEcho.exe})
}

// startExchangePods makes on every node a pod of app a (upgrade-N,
// labelled upgradeLabel) that servers and clients run in (kubectl exec):
// one whose program survives its agent's restart, an echo client holding
// its allocation after one exchange (with a server pod of its own node's,
// made for it and deleted after).
func (e *env) startExchangePods(a app) *exchanger {
	x := &exchanger{e: e, pods: map[string]string{}, servers: map[string]serverState{}, echoed: map[string]int64{}}
	for i, n := range e.nodes {
		e.createPod(e.appServerPod(a, fmt.Sprintf("upgrade-first-%d", i), n, 1))
	}
	for i, n := range e.nodes {
		first := fmt.Sprintf("upgrade-first-%d", i)
		e.eventually(first+" listening", 2*time.Minute, func() (bool, string) {
			p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, first, metav1.GetOptions{})
			return err == nil && podReady(p), fmt.Sprint(err)
		})
		x.pods[n] = fmt.Sprintf("upgrade-%d", i)
		// 8 vconns: its server's two callers and its clients' two dials
		// at once, and the one it holds.
		p := e.appPod(a, x.pods[n], n, 8, "client", fmt.Sprintf("--addr=%s:%d", e.podIP(first), echoPort),
			"--conns=1", "--messages=1", "--hold")
		p.Labels = map[string]string{"app": upgradeLabel}
		e.createPod(p)
	}
	e.eventually("the upgrade pods running", 2*time.Minute, func() (bool, string) {
		s := e.upgradeState()
		for _, n := range e.nodes {
			if s[n].pod == "" {
				return false, fmt.Sprintf("%s: %+v", n, s[n])
			}
		}
		return true, ""
	})
	for i := range e.nodes {
		e.deletePod(fmt.Sprintf("upgrade-first-%d", i))
	}
	return x
}

// nodeState is what an exchange depends on, on one node: its agent pod
// (the ready one not being deleted), the upgrade's pod there, and the
// echo server running in it.
type nodeState struct {
	agent    string // the ready agent pod's UID; "" when none is
	image    string // its image
	pod      string // the upgrade pod, running; "" when it is not
	podIP    string
	restarts int32 // its container's restarts
	server   serverState
}

// upgradeState is every node's nodeState now but its server's; a node
// whose pods cannot be listed is not ready.
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
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		st := s[p.Spec.NodeName]
		st.pod, st.podIP = p.Name, p.Status.PodIP
		for _, c := range p.Status.ContainerStatuses {
			st.restarts += c.RestartCount
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
// found; and each node's echo server.
type exchanger struct {
	e    *env
	pods map[string]string // node → its upgrade pod

	mu      sync.Mutex
	servers map[string]serverState // node → its server
	echoed  map[string]int64       // node → messages its server's runs said they echoed
	rounds  int
	stopped bool
	done    []exchange
}

// serverState is a node's echo server: which run of it (each run one
// kubectl exec of the program), and whether it listens.
type serverState struct {
	run    int
	listen bool
}

// serve runs node's echo server in its upgrade pod until ctx ends,
// again at once whenever it ends (its agent went, or was not there).
func (x *exchanger) serve(ctx context.Context, node string) {
	for ctx.Err() == nil {
		x.serveOnce(ctx, node)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// serveOnce runs the server once: listening from the line that says so
// (examples/echo logs "listening on ADDR") until it ends.
func (x *exchanger) serveOnce(ctx context.Context, node string) {
	args := append(append([]string{"exec", "-n", "default", x.pods[node], "-c", "echo", "--"}, goEcho.exe...),
		"server", fmt.Sprintf("--port=%d", echoPort))
	cmd := exec.CommandContext(ctx, x.e.kubectl, args...)
	logs, err := cmd.StderrPipe()
	if err != nil || cmd.Start() != nil {
		return
	}
	sc := bufio.NewScanner(logs)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "listening on") {
			x.setServer(node, true)
		}
		// "vconn from ADDR: echoed N messages (ERR)", as each vconn ends.
		var n int64
		if _, after, ok := strings.Cut(sc.Text(), ": echoed "); ok {
			if _, err := fmt.Sscanf(after, "%d messages", &n); err == nil {
				x.mu.Lock()
				x.echoed[node] += n
				x.mu.Unlock()
			}
		}
	}
	_ = cmd.Wait()
	x.setServer(node, false)
}

func (x *exchanger) setServer(node string, listen bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.servers[node]
	if listen && !s.listen {
		s.run++
	}
	s.listen = listen
	x.servers[node] = s
}

// state is every node's nodeState now, its server's included.
func (x *exchanger) state() map[string]nodeState {
	s := x.e.upgradeState()
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, n := range x.e.nodes {
		st := s[n]
		st.server = x.servers[n]
		s[n] = st
	}
	return s
}

// allServing says whether every node's server listens.
func (x *exchanger) allServing() (bool, string) {
	s := x.state()
	for _, n := range x.e.nodes {
		if !s[n].server.listen || s[n].pod == "" {
			return false, fmt.Sprintf("%s: %+v", n, s[n])
		}
	}
	return true, ""
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

// run runs rounds until stop or ctx's end.
func (x *exchanger) run(ctx context.Context) {
	for ctx.Err() == nil {
		x.mu.Lock()
		stopped := x.stopped
		x.mu.Unlock()
		if stopped {
			return
		}
		x.sweep()
		time.Sleep(300 * time.Millisecond)
	}
}

// stop ends run after its round.
func (x *exchanger) stop() {
	x.mu.Lock()
	x.stopped = true
	x.mu.Unlock()
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

// one runs a client in from's upgrade pod against to's server and
// records what it found; an exchange that cannot start is not recorded.
func (x *exchanger) one(from, to string) exchange {
	e := x.e
	ex := exchange{from: from, to: to, before: x.state()}
	if ex.before[from].pod == "" || ex.before[to].podIP == "" || !ex.before[to].server.listen {
		// Nothing to run from, or nothing listens there: no exchange.
		ex.err = fmt.Sprintf("not run: %s %+v, %s %+v", from, ex.before[from], to, ex.before[to])
		return ex
	}
	ex.v, ex.err = e.execClient(ex.before[from].pod, ex.before[to].podIP)
	ex.after = x.state()
	x.mu.Lock()
	x.done = append(x.done, ex)
	x.mu.Unlock()
	return ex
}

// execClient runs one exchange's client in pod against the echo server
// at ip (kubectl exec) and returns its verdict, or what it said instead.
func (e *env) execClient(pod, ip string) (v verdict, why string) {
	ctx, cancel := context.WithTimeout(e.ctx, upgradeTimeout+20*time.Second)
	defer cancel()
	args := append(append([]string{"exec", "-n", "default", pod, "-c", "echo", "--"}, goEcho.exe...),
		"client", fmt.Sprintf("--addr=%s:%d", ip, echoPort), "--conns=1",
		fmt.Sprintf("--messages=%d", upgradeMessages), "--size=4096", "--window=4",
		fmt.Sprintf("--timeout=%s", upgradeTimeout), "--verdict=/dev/stdout")
	out, _ := exec.CommandContext(ctx, e.kubectl, args...).CombinedOutput()
	why = strings.TrimSpace(string(out))
	// The verdict's JSON has no newline of its own: the summary follows it.
	if i := strings.Index(string(out), `{"ok":`); i >= 0 && json.NewDecoder(strings.NewReader(string(out[i:]))).Decode(&v) == nil {
		why = ""
	}
	if why == "" && !v.OK {
		why = v.Error
	}
	return v, why
}

// stable says whether both nodes' agents and upgrade pods, and the
// other's server, stayed up, the same ones, over the exchange: then it
// must succeed.
func (ex exchange) stable() bool {
	b, a := ex.before, ex.after
	for _, n := range []string{ex.from, ex.to} {
		if b[n].agent == "" || a[n].agent != b[n].agent || b[n].pod == "" || a[n].pod != b[n].pod || a[n].restarts != b[n].restarts {
			return false
		}
	}
	return b[ex.to].server.listen && a[ex.to].server == b[ex.to].server
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

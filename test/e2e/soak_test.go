//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/internal/echotest"
)

// soakLoad is what each checker run sends from one node to another, with
// soakWindow messages in flight on each vconn: a message that vanishes
// shows as soon as a later one comes back.
var soakLoad = load{conns: 4, msgs: 300, size: 2048}

const soakWindow = 8

// TestSoak runs `make soak` (hack/soak.sh, E2E_SOAK_DURATION): checkers
// send and verify traffic between every ordered pair of nodes for the
// duration while a schedule, at random, kills agents, restarts kubelets,
// impairs links and restarts the operator. A reliable vconn either
// delivers every message it took, whole and in order, or fails with an
// error. The checkers number their messages, soakWindow of them in flight
// per vconn, and say by number what became of each (examples/echo's
// verdict, tallied by echotest.Tally): delivered; failed, unanswered when
// the vconn failed with an error the checker was told; vanished, skipped
// over by a later message or unanswered when the checker stopped waiting
// with no error; duplicated or out of order; corrupt, every byte checked
// against the message's vconn and number. Only the first two may be
// non-zero. At the end, with the chaos stopped, one clean round
// must pass on every pair, and once the checkers are gone every agent must
// hold what it held before they came: no allocation, open vconn or buffer
// left. It prints, and writes to E2E_SOAK_REPORT if set, a table.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("E2E_SOAK_DURATION"))
	if err != nil || d <= 0 {
		t.Fatalf("E2E_SOAK_DURATION=%q: run the soak with make soak DURATION=10m (hack/soak.sh)", os.Getenv("E2E_SOAK_DURATION"))
	}
	e := setup(t)
	for _, s := range []struct {
		name string
		fn   func(*env)
	}{
		{"helm install", (*env).helmInstall},
		{"apply RDMAService", (*env).applyService},
		{"allocatable", (*env).allocatable},
	} {
		e.step(s.name, s.fn)
	}
	baseline := map[string]samples{}
	for _, n := range e.nodes {
		baseline[n] = e.agentMetrics(n)
	}
	for _, n := range e.nodes {
		e.soakServer(n)
	}

	began := time.Now()
	stop := make(chan struct{})
	var events []string
	var emu sync.Mutex
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		e.chaos(stop, func(s string) {
			if s == "" {
				return
			}
			emu.Lock()
			events = append(events, fmt.Sprintf("%6.0fs %s", time.Since(began).Seconds(), s))
			emu.Unlock()
		})
	}()

	stats := map[[2]string]*echotest.Tally{}
	var smu sync.Mutex
	var wg sync.WaitGroup
	deadline := began.Add(d)
	for _, from := range e.nodes {
		for _, to := range e.nodes {
			if from == to {
				continue
			}
			ps := &echotest.Tally{}
			stats[[2]string{from, to}] = ps
			wg.Go(func() {
				for n := 0; time.Now().Before(deadline); n++ {
					v := e.soakRun(fmt.Sprintf("soak-%s-%s-%d", short(from), short(to), n), from, to)
					smu.Lock()
					ps.Add(v)
					smu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	<-chaosDone
	t.Logf("soak: %s of traffic and chaos", time.Since(began).Round(time.Second))

	// The chaos is over: everything recovers and every pair works.
	e.eventually("every agent ready after the chaos", 5*time.Minute, e.agentReady)
	for _, n := range e.nodes {
		e.soakServer(n)
	}
	final := map[[2]string]verdict{}
	for key := range stats {
		final[key] = e.soakRun(fmt.Sprintf("final-%s-%s", short(key[0]), short(key[1])), key[0], key[1])
	}
	for _, n := range e.nodes {
		e.deletePod("soak-server-" + n)
	}
	leaks := e.soakLeaks(baseline)

	report := soakReport(d, stats, final, events, leaks)
	t.Log("\n" + report)
	if path := os.Getenv("E2E_SOAK_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
	for key, ps := range stats {
		if !ps.Sound() {
			t.Errorf("%s → %s: on reliable vconns, %d messages vanished without an error, %d came back duplicated or out of order, %d corrupt",
				key[0], key[1], ps.Vanished, ps.Misordered, ps.Corrupt)
		}
		if ps.OK == 0 {
			t.Errorf("%s → %s: no checker run succeeded in %s", key[0], key[1], d)
		}
	}
	for key, v := range final {
		if !v.OK {
			t.Errorf("after the chaos, %s → %s: %s", key[0], key[1], v.Error)
		}
	}
	for _, l := range leaks {
		t.Errorf("leaked: %s", l)
	}
}

func short(node string) string { return node[strings.LastIndexByte(node, '-')+1:] }

// soakServer makes sure node runs an echo server.
func (e *env) soakServer(node string) {
	name := "soak-server-" + node
	p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	switch {
	case err == nil && p.DeletionTimestamp == nil && (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodPending):
		return
	case err == nil:
		e.deletePod(name)
	case !apierrors.IsNotFound(err):
		e.t.Fatal(err)
	}
	e.createPod(e.serverPod(name, node, 64))
}

// soakRun runs one checker from one node to another and returns its
// verdict; a run that cannot even start (its pod refused while an agent
// restarts) is a failure with the reason.
func (e *env) soakRun(name, from, to string) verdict {
	server, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "soak-server-"+to, metav1.GetOptions{})
	if err != nil || server.Status.PodIP == "" {
		return verdict{Error: fmt.Sprintf("the server on %s has no IP: %v", to, err)}
	}
	pod := e.echoPod(name, from, int64(soakLoad.conns), "client", fmt.Sprintf("--addr=%s:%d", server.Status.PodIP, echoPort),
		fmt.Sprintf("--conns=%d", soakLoad.conns), fmt.Sprintf("--messages=%d", soakLoad.msgs),
		fmt.Sprintf("--size=%d", soakLoad.size), fmt.Sprintf("--window=%d", soakWindow), "--timeout=90s", "--verdict=/dev/termination-log")
	if _, err := e.kube.CoreV1().Pods("default").Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		return verdict{Error: "creating the checker: " + err.Error()}
	}
	defer func() {
		_ = e.kube.CoreV1().Pods("default").Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	}()
	for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		if p.Status.Phase == corev1.PodFailed && len(p.Status.ContainerStatuses) == 0 {
			return verdict{Error: "pod failed: " + p.Status.Reason + ": " + p.Status.Message}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if term := cs.State.Terminated; term != nil {
				var v verdict
				if err := json.Unmarshal([]byte(term.Message), &v); err != nil {
					return verdict{Error: fmt.Sprintf("exit %d without a verdict: %s", term.ExitCode, term.Message)}
				}
				return v
			}
		}
	}
	return verdict{Error: "no verdict in 3 minutes"}
}

// chaos does one thing at random every 20 to 40 seconds until stop: kills
// a node's agent, restarts a node's kubelet, impairs the link between two
// nodes for 15 seconds, or restarts the operator; then it makes sure every
// node has an echo server again.
func (e *env) chaos(stop <-chan struct{}, record func(string)) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(20+rng.IntN(21)) * time.Second):
		}
		node := e.nodes[rng.IntN(len(e.nodes))]
		switch rng.IntN(4) {
		case 0:
			record("kill the agent on " + node)
			pods, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + agentApp})
			if err == nil {
				for _, p := range pods.Items {
					if p.Spec.NodeName == node {
						_ = e.kube.CoreV1().Pods(namespace).Delete(e.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
					}
				}
			}
		case 1:
			record("restart the kubelet on " + node)
			record(e.try("hack/local-cluster/up.sh", "--restart", "kubelet", node))
		case 2:
			other := e.nodes[(slices.Index(e.nodes, node)+1+rng.IntN(len(e.nodes)-1))%len(e.nodes)]
			record(fmt.Sprintf("impair %s ↔ %s: 5%% loss, 5%% reordering, 15s", node, other))
			sh := os.Getenv("E2E_NODE_SH")
			record(e.try(sh, node, "netem", other, "delay", "1ms", "reorder", "5%", "loss", "5%"))
			record(e.try(sh, other, "netem", node, "delay", "1ms", "reorder", "5%", "loss", "5%"))
			time.Sleep(15 * time.Second)
			record(e.try(sh, node, "netem", "clear"))
			record(e.try(sh, other, "netem", "clear"))
		case 3:
			record("restart the operator")
			_ = e.kube.CoreV1().Pods(namespace).DeleteCollection(e.ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))},
				metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=operator"})
		}
		// A server whose agent went is gone with it: make it again once
		// its node serves again.
		e.eventuallySoft(2*time.Minute, func() bool { ok, _ := e.agentReady(); return ok })
		for _, n := range e.nodes {
			e.soakServer(n)
		}
	}
}

// eventuallySoft waits for cond up to timeout without failing.
func (e *env) eventuallySoft(timeout time.Duration, cond func() bool) {
	for end := time.Now().Add(timeout); time.Now().Before(end) && !cond(); {
		time.Sleep(time.Second)
	}
}

// soakLeaks compares every agent with its baseline once the checkers and
// servers are gone: allocations, open vconns and vconns toward peers back
// to what they were, buffers in use no more than then.
func (e *env) soakLeaks(baseline map[string]samples) []string {
	var leaks []string
	for _, n := range e.nodes {
		var last []string
		e.eventuallySoft(2*time.Minute, func() bool {
			last = nil
			m := e.agentMetrics(n)
			for _, c := range []struct{ metric, how string }{
				{"rdmavisor_allocations", "="},
				{`rdmavisor_vconns{state="open"}`, "="},
				{"rdmavisor_peer_vconns", "="},
				{"rdmavisor_buffers_in_use", "<="},
			} {
				got, was := m.sum(c.metric), baseline[n].sum(c.metric)
				if (c.how == "=" && got != was) || (c.how == "<=" && got > was) {
					last = append(last, fmt.Sprintf("%s: %s = %v, %v before the soak", n, c.metric, got, was))
				}
			}
			return len(last) == 0
		})
		leaks = append(leaks, last...)
	}
	return leaks
}

func soakReport(d time.Duration, stats map[[2]string]*echotest.Tally, final map[[2]string]verdict, events, leaks []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak: %s, %d vconns × %d messages of %d bytes, %d in flight, per checker run\n\n", d, soakLoad.conns, soakLoad.msgs, soakLoad.size, soakWindow)
	keys := make([][2]string, 0, len(stats))
	for k := range stats {
		keys = append(keys, k)
	}
	sortPairs(keys)
	rows := make([]echotest.Row, 0, len(keys))
	for _, k := range keys {
		after := "ok"
		if !final[k].OK {
			after = "FAILED: " + final[k].Error
		}
		rows = append(rows, echotest.Row{From: k[0], To: k[1], Tally: *stats[k], After: after})
	}
	echotest.WriteTable(&b, rows)
	fmt.Fprintf(&b, "\nResources leaked once the checkers were gone: %d\n", len(leaks))
	for _, l := range leaks {
		fmt.Fprintf(&b, "- %s\n", l)
	}
	fmt.Fprintf(&b, "\nChaos (%d events):\n", len(events))
	for _, ev := range events {
		fmt.Fprintf(&b, "- %s\n", ev)
	}
	return b.String()
}

func sortPairs(k [][2]string) {
	slices.SortFunc(k, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
}

// try runs a command for the chaos schedule, which must not fail the
// test from its goroutine: it returns what went wrong, or "".
func (e *env) try(name string, args ...string) string {
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Sprintf("  (%s %s failed: %v: %.200s)", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return ""
}

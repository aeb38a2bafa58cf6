//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers"
)

// manyLoad is the 1,000-vconn exchange, split between two clients on the
// two nodes that are not the server's: 500 vconns each, 20 messages of
// 1 KiB on every one.
var manyLoad = load{conns: 500, msgs: 20, size: 1024}

// otherNodes are the nodes other than the server's.
func (e *env) otherNodes() []string {
	var o []string
	for _, n := range e.nodes {
		if n != e.serverNode() {
			o = append(o, n)
		}
	}
	return o
}

// thousandVConns: pods on the two other nodes echo over 1,000 vconns in
// all to the server, every byte checked, over the service's transport;
// then every agent still holds exactly qpsPerPeer RC QPs toward each peer
// it talked to, and as many ingress QPs from it: the pools do not grow
// with the vconns.
func (e *env) thousandVConns(transport string) {
	e.serviceTransportIs(transport)
	clients := map[string]string{}
	for i, node := range e.otherNodes() {
		name := fmt.Sprintf("many-%s-%d", transport, i)
		clients[name] = node
		e.startClient(name, node, e.podIP("echo-server"), manyLoad)
	}
	for name := range clients {
		e.clientOK(name, manyLoad, 4*time.Minute)
	}
	sent := 0.0
	for _, node := range e.nodes {
		m := e.agentMetrics(node)
		sent += m.sum(`rdmavisor_messages_sent_total{transport="` + transport + `"}`)
	}
	// Each message went out once from its client's agent and once back
	// from the server's, over the service's transport.
	if want := float64(2 * len(clients) * manyLoad.conns * manyLoad.msgs); sent < want {
		e.t.Errorf("messages sent over %s on all agents: %v, want at least %v", transport, sent, want)
	}
	e.poolsAreConfigured()
	for name := range clients {
		e.deletePod(name)
	}
}

// serviceTransportIs checks what the agents were configured with.
func (e *env) serviceTransportIs(transport string) {
	var svc v1alpha1.RDMAService
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.svc.Name}, &svc); err != nil {
		e.t.Fatal(err)
	}
	if string(svc.Spec.Transport) != transport {
		e.t.Fatalf("the RDMAService's transport is %q, want %q", svc.Spec.Transport, transport)
	}
}

// poolsAreConfigured reads every agent's QP gauges: toward each peer it
// made QPs for, exactly qpsPerPeer RC QPs, and none or qpsPerPeer UC QPs
// (Auto's datagrams); and what it counts as ingress from a peer is what
// that peer made toward it.
func (e *env) poolsAreConfigured() {
	want := float64(*e.svc.Spec.QPsPerPeer)
	m := map[string]samples{}
	for _, node := range e.nodes {
		m[node] = e.agentMetrics(node)
	}
	qps := func(node, peer, typ string) float64 {
		return m[node].sum(`rdmavisor_qps{peer="` + peer + `",type="` + typ + `"}`)
	}
	for _, node := range e.nodes {
		peers := 0
		for _, peer := range e.nodes {
			if peer == node {
				continue
			}
			rc, uc, in := qps(node, peer, "rc"), qps(node, peer, "uc"), qps(node, peer, "ingress")
			if rc == 0 && uc == 0 && in == 0 {
				continue // these two talked over no vconn
			}
			peers++
			if rc != want || (uc != 0 && uc != want) {
				e.t.Errorf("agent on %s toward %s: %v RC and %v UC QPs, want %v RC and 0 or %v UC", node, peer, rc, uc, want, want)
			}
			if made := qps(peer, node, "rc") + qps(peer, node, "uc"); in != made {
				e.t.Errorf("agent on %s counts %v ingress QPs from %s, which made %v toward it", node, in, peer, made)
			}
		}
		if peers == 0 {
			e.t.Errorf("agent on %s holds QPs toward no peer", node)
		}
		e.t.Logf("agent on %s: QP pools toward %d peers", node, peers)
	}
}

// nodeCertificates: each agent serves, on its control port, a certificate
// the cluster CA (the operator's) signed for its own node: the node's
// name and the node's IP, no other's. Its peers accepted it: the vconns
// between them above worked.
func (e *env) nodeCertificates() {
	// The operator publishes its CA's certificate in a ConfigMap.
	cm, err := e.kube.CoreV1().ConfigMaps(namespace).Get(e.ctx, controllers.CAName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(cm.Data[controllers.CABundleKey])) {
		e.t.Fatalf("ConfigMap %s has no CA certificate under %s", controllers.CAName, controllers.CABundleKey)
	}
	for _, node := range e.nodes {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: node}, &rn); err != nil {
			e.t.Fatal(err)
		}
		n, err := e.kube.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		ip := internalIP(n)
		cert := e.servedCertificate(net.JoinHostPort(ip, strconv.Itoa(int(rn.Status.Address.ControlPort))))
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			e.t.Errorf("agent on %s: its certificate is not the cluster CA's: %v", node, err)
		}
		if !strings.Contains(cert.Subject.CommonName, node) && !slices.Contains(cert.DNSNames, node) {
			e.t.Errorf("agent on %s: certificate for %q %v, not its node", node, cert.Subject.CommonName, cert.DNSNames)
		}
		var ips []string
		for _, a := range cert.IPAddresses {
			ips = append(ips, a.String())
		}
		if !slices.Contains(ips, ip) {
			e.t.Errorf("agent on %s: certificate for IPs %v, not its node's %s", node, ips, ip)
		}
		for _, other := range e.nodes {
			if other == node {
				continue
			}
			on, err := e.kube.CoreV1().Nodes().Get(e.ctx, other, metav1.GetOptions{})
			if err != nil {
				e.t.Fatal(err)
			}
			if slices.Contains(ips, internalIP(on)) || slices.Contains(cert.DNSNames, other) {
				e.t.Errorf("agent on %s: its certificate also names %s", node, other)
			}
		}
		e.t.Logf("agent on %s: certificate %q, IPs %v, valid until %s", node, cert.Subject.CommonName, ips, cert.NotAfter.Format(time.RFC3339))
	}
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// servedCertificate reads the certificate a TLS server presents at addr.
// The suite has no client certificate, so the server ends the handshake
// after it sent its own: that is all this needs.
func (e *env) servedCertificate(addr string) *x509.Certificate {
	e.t.Helper()
	var got *x509.Certificate
	cfg := &tls.Config{InsecureSkipVerify: true, VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
		c, err := x509.ParseCertificate(raw[0])
		got = c
		return err
	}}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
	}
	if got == nil {
		e.t.Fatalf("no certificate from %s: %v", addr, err)
	}
	return got
}

// progressing is the service's Progressing condition for its current
// generation, nil until the operator has written one.
func (e *env) progressing() *metav1.Condition {
	var svc v1alpha1.RDMAService
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.svc.Name}, &svc); err != nil {
		return nil
	}
	c := meta.FindStatusCondition(svc.Status.Conditions, v1alpha1.ConditionProgressing)
	if c == nil || c.ObservedGeneration != svc.Generation {
		return nil
	}
	return c
}

// rollTo changes the service's transport with a helm upgrade, which changes every agent's
// configuration: the DaemonSet rolls its agents one node at a time. It
// watches the agent pods, every change of them, and measures per node how
// long the node had no ready agent; it fails if two nodes were ever
// without one at once, at any change, or the service does not return to
// Ready.
func (e *env) rollTo(transport string) {
	// A node whose agent is not ready when the roll begins is replaced at
	// once, beside the one the roll takes down (the DaemonSet controller
	// replaces an unavailable old pod without counting it): start from
	// every agent ready.
	e.eventually("every agent ready before the roll", 2*time.Minute, e.agentReady)
	before := map[string]types.UID{}
	for _, n := range e.nodes {
		before[n] = e.agentPod(n).UID
	}
	// The service, applied with kubectl, is handed to the Helm release
	// (the labels and annotations Helm adopts an object by) by an upgrade
	// that renders it as the chart's default service, as it is: Helm
	// takes an adopted object over without changing it. The next upgrade
	// changes its transport: a helm upgrade that changes the agents'
	// configuration.
	e.run(e.kubectl, "label", "rdmaservice", e.svc.Name, "--overwrite", "app.kubernetes.io/managed-by=Helm")
	e.run(e.kubectl, "annotate", "rdmaservice", e.svc.Name, "--overwrite",
		"meta.helm.sh/release-name="+release, "meta.helm.sh/release-namespace="+namespace)
	s := e.svc.Spec
	upgrade := func(transport string) {
		e.run(e.helm, "upgrade", release, "charts/rdmavisor", "--namespace", namespace, "--reuse-values",
			"--set", "defaultService.enabled=true", "--set", "defaultService.name="+e.svc.Name,
			"--set", "defaultService.device.provider="+string(s.Device.Provider), "--set", "defaultService.transport="+transport,
			"--set", fmt.Sprintf("defaultService.qpsPerPeer=%d", *s.QPsPerPeer), "--set", "defaultService.bufferPoolSize="+s.BufferPoolSize.String(),
			"--set", fmt.Sprintf("defaultService.vconnsPerNode=%d", *s.VConnsPerNode), "--set", "defaultService.resourceName="+s.ResourceName,
			"--set", "defaultService.agent.image="+s.Agent.Image, "--set", "defaultService.agent.imagePullPolicy="+string(s.Agent.ImagePullPolicy),
			"--set", "defaultService.allocation="+string(s.Allocation))
	}
	ds, err := e.daemonSet()
	if err != nil {
		e.t.Fatal(err)
	}
	upgrade(string(s.Transport))
	time.Sleep(2 * time.Second) // what the operator would render, it has by now
	if d, err := e.daemonSet(); err != nil || d.Generation != ds.Generation {
		e.t.Fatalf("adopting the service into the release changed the agents' DaemonSet: %v (generation %d, was %d)", err, d.Generation, ds.Generation)
	}
	// Every change of an agent pod from here on, in the order the API
	// server made them (a watch from the list's resourceVersion, resumed
	// where it broke): the roll's transitions as they happened, so an
	// overlap of two nodes down, however short, is seen, where a poll
	// could fall on either side of it.
	sel := "app.kubernetes.io/name=" + agentApp
	pl, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		e.t.Fatal(err)
	}
	pods := map[types.UID]corev1.Pod{}
	for _, p := range pl.Items {
		pods[p.UID] = p
	}
	wctx, stopWatch := context.WithCancel(e.ctx)
	defer stopWatch()
	rw, err := watchtools.NewRetryWatcherWithContext(wctx, pl.ResourceVersion, podWatcher{e.kube.CoreV1().Pods(namespace), sel})
	if err != nil {
		e.t.Fatal(err)
	}
	defer rw.Stop()
	began := time.Now()
	upgrade(transport)
	e.serviceTransportIs(transport)
	down := map[string]time.Time{}
	outage := map[string]time.Duration{}
	maxDown := 0
	// The roll as it went, a line per change: what a failure is read by.
	var timeline []string
	last := ""
	// seen takes the pods as they are after a change, at now, and says
	// whether every node has a new agent, ready.
	seen := func(now time.Time) (done bool, why string) {
		ready := map[string]bool{}
		replaced := map[string]bool{}
		for _, p := range pods {
			if p.DeletionTimestamp == nil && podReady(&p) {
				ready[p.Spec.NodeName] = true
				replaced[p.Spec.NodeName] = p.UID != before[p.Spec.NodeName]
			}
		}
		all := slices.SortedFunc(maps.Values(pods), func(a, b corev1.Pod) int {
			return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), strings.Compare(a.Name, b.Name))
		})
		if s := rollState(all, before); s != last {
			last = s
			timeline = append(timeline, fmt.Sprintf("+%5.1fs %s", now.Sub(began).Seconds(), s))
		}
		downNow := 0
		for _, n := range e.nodes {
			switch {
			case !ready[n]:
				downNow++
				if _, ok := down[n]; !ok {
					down[n] = now
				}
			case replaced[n]:
				if t, ok := down[n]; ok && outage[n] == 0 {
					outage[n] = now.Sub(t)
				}
			}
		}
		maxDown = max(maxDown, downNow)
		for _, n := range e.nodes {
			if !replaced[n] || !ready[n] {
				return false, fmt.Sprintf("ready %v, replaced %v", ready, replaced)
			}
		}
		return true, ""
	}
	timeout := time.After(5 * time.Minute)
	// Progressing must stay True until every agent runs the new spec: a
	// script waiting for it to turn False must not go on mid-roll.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var progressingFalse []string
	for done, why := seen(time.Now()); !done; done, why = seen(time.Now()) {
		if c := e.progressing(); c != nil && c.Status == metav1.ConditionFalse {
			progressingFalse = append(progressingFalse, fmt.Sprintf("+%.1fs %s: %s (%s)", time.Since(began).Seconds(), c.Reason, c.Message, why))
		}
		select {
		case <-tick.C:
		case ev, ok := <-rw.ResultChan():
			if !ok {
				e.t.Fatalf("the watch of the agent pods ended (%s):\n%s", why, strings.Join(timeline, "\n"))
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				p := ev.Object.(*corev1.Pod)
				pods[p.UID] = *p
			case watch.Deleted:
				delete(pods, ev.Object.(*corev1.Pod).UID)
			case watch.Error:
				e.t.Fatalf("watching the agent pods: %v\n%s", apierrors.FromObject(ev.Object), strings.Join(timeline, "\n"))
			}
		case <-timeout:
			e.t.Fatalf("every agent replaced and ready: not after 5m0s: %s\n%s", why, strings.Join(timeline, "\n"))
		}
	}
	stopWatch()
	if len(progressingFalse) > 0 {
		e.t.Errorf("Progressing was False for the new spec while agents had not all rolled:\n%s\n%s",
			strings.Join(progressingFalse, "\n"), strings.Join(timeline, "\n"))
	}
	e.eventually("Progressing False (Complete) once the roll is over", 2*time.Minute, func() (bool, string) {
		c := e.progressing()
		return c != nil && c.Status == metav1.ConditionFalse, fmt.Sprintf("%+v", c)
	})
	e.eventually("the service Ready after the roll", 2*time.Minute, e.agentReady)
	if maxDown > 1 {
		e.t.Errorf("%d nodes were without a ready agent at once; the roll must go one node at a time:\n%s",
			maxDown, strings.Join(timeline, "\n"))
	} else {
		e.t.Logf("roll to %s, as it went:\n%s", transport, strings.Join(timeline, "\n"))
	}
	var outages []string
	for _, n := range e.nodes {
		e.t.Logf("roll to %s: the agent on %s was not ready for %s", transport, n, outage[n].Round(100*time.Millisecond))
		outages = append(outages, fmt.Sprintf("%s %s", n, outage[n].Round(100*time.Millisecond)))
	}
	took := time.Since(began).Round(100 * time.Millisecond)
	e.t.Logf("roll to %s: %s from the patch to every agent ready", transport, took)
	e.measured("roll to "+transport+": each node without a ready agent", "%s", strings.Join(outages, ", "))
	e.measured("roll to "+transport+": from helm upgrade to every agent replaced and ready", "%s", took)
	e.svc.Spec.Transport = v1alpha1.Transport(transport)
	// The agents are new: the server's agent lost its vconns; start anew.
	e.deletePod("echo-server")
	e.startServerAfterRestart()
	var svc v1alpha1.RDMAService
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.svc.Name}, &svc); err != nil {
		e.t.Fatal(err)
	}
	if c := meta.FindStatusCondition(svc.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		e.t.Fatalf("RDMAService Ready: %+v", c)
	}
}

// podWatcher watches the pods of a label selector, for a RetryWatcher.
type podWatcher struct {
	pods     typedcorev1.PodInterface
	selector string
}

func (w podWatcher) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.LabelSelector = w.selector
	return w.pods.Watch(ctx, o)
}

// rollState says, node by node, which agent pod is there (old or new),
// whether it is ready or going, and its containers' restarts: a
// container that restarted makes its pod unready, whatever the roll does.
func rollState(pods []corev1.Pod, before map[string]types.UID) string {
	byNode := map[string][]string{}
	for _, p := range pods {
		age := "new"
		if p.UID == before[p.Spec.NodeName] {
			age = "old"
		}
		state := "not ready"
		switch {
		case p.DeletionTimestamp != nil:
			state = "going"
		case podReady(&p):
			state = "ready"
		}
		var restarts int32
		for _, c := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			restarts += c.RestartCount
		}
		s := age + " " + state
		if restarts > 0 {
			s += fmt.Sprintf(" (%d restarts)", restarts)
		}
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], s)
	}
	nodes := slices.Sorted(maps.Keys(byNode))
	parts := make([]string, 0, len(nodes))
	for _, n := range nodes {
		parts = append(parts, n+": "+strings.Join(byNode[n], " + "))
	}
	return strings.Join(parts, "; ")
}

func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// agentMetrics scrapes the agent on node at the port its pod's scrape
// annotation names.
func (e *env) agentMetrics(node string) samples {
	e.t.Helper()
	p := e.agentPod(node)
	return e.scrape(p.Name, p.Annotations["prometheus.io/port"])
}

const grpcechoImage = "local.test/rdmavisor-grpcecho:dev"

// grpcEcho: a grpc-go client on one node calls servers on the two others
// through a headless Service's name, resolved by the cluster's DNS and by
// gRPC's own dns:/// resolver, as pkg/vconn documents: every call's bytes
// come back as sent.
func (e *env) grpcEcho() {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "grpcecho", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, // headless: the name resolves to the pods' IPs
			Selector:  map[string]string{"app": "grpcecho-server"},
			Ports:     []corev1.ServicePort{{Name: "grpc", Port: 7100, Protocol: corev1.ProtocolTCP}},
		},
	}
	if _, err := e.kube.CoreV1().Services("default").Create(e.ctx, svc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = e.kube.CoreV1().Services("default").Delete(e.ctx, svc.Name, metav1.DeleteOptions{}) }()
	var servers []string
	for i, node := range e.otherNodes() {
		name := fmt.Sprintf("grpcecho-server-%d", i)
		p := e.echoPod(name, node, 4, "server", "--port=7100")
		p.Labels["app"] = "grpcecho-server"
		p.Spec.Containers[0].Image = grpcechoImage
		e.createPod(p)
		servers = append(servers, name)
	}
	for _, name := range servers {
		e.eventually("gRPC server "+name+" ready", 2*time.Minute, func() (bool, string) {
			p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
			return err == nil && podReady(p), fmt.Sprint(err)
		})
	}
	const calls, size = 200, 4096
	c := e.echoPod("grpcecho-client", e.clientNode(), 4, "client",
		"--target=dns:///grpcecho.default.svc.cluster.local:7100", fmt.Sprintf("--calls=%d", calls),
		fmt.Sprintf("--size=%d", size), "--timeout=3m", "--verdict=/dev/termination-log")
	c.Spec.Containers[0].Image = grpcechoImage
	e.createPod(c)
	v := e.clientVerdict("grpcecho-client", 4*time.Minute)
	if !v.OK || v.Sent != calls || v.Delivered != calls {
		e.t.Fatalf("gRPC client verdict %+v, want %d calls sent and checked\n%s", v, calls, e.logs("grpcecho-client"))
	}
	e.t.Log(strings.TrimSpace(e.logs("grpcecho-client")))
	for _, p := range append(servers, "grpcecho-client") {
		e.deletePod(p)
	}
}

// certRotation renews every agent's node certificate while a client
// exchanges messages across nodes: the client's vconns lose nothing, each
// agent then serves its new certificate (a new serial, its own node), and
// new vconns across nodes work under the new certificates.
func (e *env) certRotation() {
	l := load{conns: 10, msgs: 2000, size: 4096}
	e.startClient("during-rotation", e.clientNode(), e.podIP("echo-server"), l)
	e.eventually("the client is exchanging", time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "during-rotation", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, fmt.Sprint(err)
	})
	for _, node := range e.nodes {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: node}, &rn); err != nil {
			e.t.Fatal(err)
		}
		addr := net.JoinHostPort(rn.Status.Address.IP, strconv.Itoa(int(rn.Status.Address.ControlPort)))
		before := e.servedCertificate(addr)
		var renewed struct {
			Serial   string
			Subject  string
			NotAfter time.Time
		}
		e.agentState(node, "renew-certificate", &renewed)
		if renewed.Serial == "" || renewed.Serial == before.SerialNumber.String() || !strings.Contains(renewed.Subject, node) {
			e.t.Fatalf("agent on %s renewed to %+v; it served serial %v before", node, renewed, before.SerialNumber)
		}
		e.eventually("the agent on "+node+" serves its new certificate", time.Minute, func() (bool, string) {
			got := e.servedCertificate(addr).SerialNumber.String()
			return got == renewed.Serial, "serving serial " + got
		})
		e.t.Logf("agent on %s: certificate %s renewed to %s, valid until %s", node, before.SerialNumber, renewed.Serial, renewed.NotAfter.Format(time.RFC3339))
	}
	e.clientOK("during-rotation", l, 4*time.Minute)
	e.deletePod("during-rotation")
	e.exchange("after-rotation", e.otherNodes()[1], defaultLoad)
	e.deletePod("after-rotation")
}

//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// lossyLink: the link between the server's node and another loses 5% and
// reorders 5% of its packets, both ways, during an echo over the
// service's (reliable) transport: every message arrives once, in order,
// every byte as sent. The impairment's own counters say it dropped and
// reordered packets.
func (e *env) lossyLink() {
	peer := e.otherNodes()[1]
	pairs := [][2]string{{peer, e.serverNode()}, {e.serverNode(), peer}}
	for _, pair := range pairs {
		e.nodeSH(pair[0], "netem", pair[1], "delay", "1ms", "reorder", "5%", "loss", "5%")
	}
	cleared := false
	clear := func() string {
		out := ""
		for _, pair := range pairs {
			out += e.nodeSH(pair[0], "netem", "clear")
		}
		cleared = true
		return out
	}
	defer func() {
		if !cleared {
			clear()
		}
	}()
	retx := e.agentMetrics(peer).sum("rdmavisor_retransmissions_total")
	l := load{conns: 20, msgs: 100, size: 4096}
	e.exchange("lossy", peer, l)
	after := e.agentMetrics(peer).sum("rdmavisor_retransmissions_total")
	var dropped, reordered int
	for line := range strings.Lines(clear()) {
		var st struct{ Dropped, Reordered int }
		if json.Unmarshal([]byte(line), &st) == nil {
			dropped += st.Dropped
			reordered += st.Reordered
		}
	}
	if dropped == 0 || reordered == 0 {
		e.t.Errorf("the impaired link dropped %d and reordered %d packets: the echo ran over no impairment", dropped, reordered)
	}
	e.t.Logf("over a link with 5%% loss and 5%% reordering (%d packets dropped, %d reordered): %d messages checked, %v retransmissions on %s",
		dropped, reordered, l.conns*l.msgs, after-retx, peer)
	e.deletePod("lossy")
}

// operatorRestart deletes the operator's pod while a client exchanges
// messages: the data path does not go through the operator, so the
// client's vconns carry on, and a new operator takes over the service.
func (e *env) operatorRestart() {
	l := load{conns: 10, msgs: 3000, size: 4096}
	e.startClient("during-operator-restart", e.clientNode(), e.podIP("echo-server"), l)
	e.eventually("the client is exchanging", time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "during-operator-restart", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, fmt.Sprintf("%v", err)
	})
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=operator"}
	old, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, sel)
	if err != nil || len(old.Items) != 1 {
		e.t.Fatalf("operator pods: %v %v", old, err)
	}
	if err := e.kube.CoreV1().Pods(namespace).Delete(e.ctx, old.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		e.t.Fatal(err)
	}
	e.clientOK("during-operator-restart", l, 4*time.Minute)
	e.eventually("a new operator ready", 2*time.Minute, func() (bool, string) {
		l, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, sel)
		if err != nil || len(l.Items) != 1 || l.Items[0].UID == old.Items[0].UID {
			return false, fmt.Sprintf("%d operator pods %v", len(l.Items), err)
		}
		return podReady(&l.Items[0]), "not ready"
	})
	e.eventually("the service Ready under the new operator", 2*time.Minute, e.agentReady)
	e.deletePod("during-operator-restart")
}

// rollTo changes the service's transport with a helm upgrade, which changes every agent's
// configuration: the DaemonSet rolls its agents one node at a time. It
// measures, per node, how long the node had no ready agent, and fails if
// two nodes were ever without one at once or the service does not return
// to Ready.
func (e *env) rollTo(transport string) {
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
			"--set", "defaultService.agent.image="+s.Agent.Image, "--set", "defaultService.agent.imagePullPolicy="+string(s.Agent.ImagePullPolicy))
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
	began := time.Now()
	upgrade(transport)
	e.serviceTransportIs(transport)
	down := map[string]time.Time{}
	outage := map[string]time.Duration{}
	maxDown := 0
	e.eventually("every agent replaced and ready", 5*time.Minute, func() (bool, string) {
		ready := map[string]bool{}
		replaced := map[string]bool{}
		for _, p := range e.agentPods() {
			if p.DeletionTimestamp == nil && podReady(&p) {
				ready[p.Spec.NodeName] = true
				replaced[p.Spec.NodeName] = p.UID != before[p.Spec.NodeName]
			}
		}
		now, downNow := time.Now(), 0
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
	})
	e.eventually("the service Ready after the roll", 2*time.Minute, e.agentReady)
	if maxDown > 1 {
		e.t.Errorf("%d nodes were without a ready agent at once; the roll must go one node at a time", maxDown)
	}
	for _, n := range e.nodes {
		e.t.Logf("roll to %s: the agent on %s was not ready for %s", transport, n, outage[n].Round(100*time.Millisecond))
	}
	e.t.Logf("roll to %s: %s from the patch to every agent ready", transport, time.Since(began).Round(100*time.Millisecond))
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

// verdict is what an echo client wrote to its termination log once it
// ended (examples/echo --verdict).
type verdict struct {
	OK        bool      `json:"ok"`
	Error     string    `json:"error"`
	At        time.Time `json:"at"`
	Sent      int64     `json:"sent"`
	Delivered int64     `json:"delivered"`
}

// clientVerdict waits for the client pod to end and returns its verdict.
func (e *env) clientVerdict(name string, timeout time.Duration) verdict {
	e.t.Helper()
	var v verdict
	e.eventually("client "+name+" ended", timeout, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range p.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil {
				if err := json.Unmarshal([]byte(t.Message), &v); err != nil {
					e.t.Fatalf("client %s ended (exit %d) without a verdict: %q: %v", name, t.ExitCode, t.Message, err)
				}
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s", p.Status.Phase)
	})
	return v
}

// nodeLost freezes every process of a node (its agent, kubelet, pods)
// while a client on another node exchanges messages with a server on it:
// the client's vconns fail with an error naming the lost node within 5 s,
// the client's agent releases the QPs and vconns it held toward it, and
// once the node is back a new client reaches the same server. The node
// lost is not the operator's: a single operator on a lost node reports
// nothing until it is back (or rescheduled), which is what its one replica
// costs.
func (e *env) nodeLost() {
	from := e.clientNode()
	ops, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=operator"})
	if err != nil || len(ops.Items) != 1 {
		e.t.Fatalf("operator pods: %v %v", ops, err)
	}
	lost := ""
	for _, n := range slices.Backward(e.nodes) {
		if n != from && n != ops.Items[0].Spec.NodeName {
			lost = n
			break
		}
	}
	e.createPod(e.serverPod("lost-server", lost, 8))
	e.eventually("the server on "+lost+" running", 2*time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "lost-server", metav1.GetOptions{})
		return err == nil && podReady(p), fmt.Sprintf("%v", err)
	})
	endless := load{conns: 4, msgs: 1 << 30, size: 1024}
	e.startClient("lost-client", from, e.podIP("lost-server"), endless)
	peerVConns := `rdmavisor_peer_vconns{peer="` + lost + `"}`
	e.eventually("the client's vconns open toward "+lost, 2*time.Minute, func() (bool, string) {
		n := e.agentMetrics(from).sum(peerVConns)
		return n == float64(endless.conns), fmt.Sprintf("%s = %v", peerVConns, n)
	})
	frozen := time.Now()
	e.nodeSH(lost, "freeze")
	thawed := false
	defer func() {
		if !thawed {
			e.nodeSH(lost, "thaw")
		}
	}()
	v := e.clientVerdict("lost-client", time.Minute)
	took := v.At.Sub(frozen)
	e.t.Logf("node %s frozen: the client on %s failed after %s: %s", lost, from, took.Round(time.Millisecond), v.Error)
	if v.OK || !strings.Contains(v.Error, lost) {
		e.t.Errorf("client verdict %+v: want a failure naming %s", v, lost)
	}
	if took > 5*time.Second {
		e.t.Errorf("the client's vconns failed %s after the node was lost, want within 5s", took)
	}
	e.eventually("the agent on "+from+" released its vconns and QPs toward "+lost, time.Minute, func() (bool, string) {
		m := e.agentMetrics(from)
		open, qps := m.sum(peerVConns), m.sum(`rdmavisor_qps{peer="`+lost+`"}`)
		return open == 0 && qps == 0, fmt.Sprintf("%s = %v, QPs toward it %v", peerVConns, open, qps)
	})
	e.deletePod("lost-client")
	// The surviving agents say which node they lost, and the operator
	// says it on the service.
	e.eventually("the RDMANode of "+from+" and the RDMAService name "+lost+" unreachable", time.Minute, func() (bool, string) {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: from}, &rn); err != nil {
			return false, err.Error()
		}
		pc := meta.FindStatusCondition(rn.Status.Conditions, v1alpha1.ConditionPeersReachable)
		if pc == nil || pc.Status != metav1.ConditionFalse || !strings.Contains(pc.Message, lost) || !slices.Contains(rn.Status.UnreachablePeers, lost) {
			return false, fmt.Sprintf("RDMANode %s: PeersReachable %+v, unreachable %v", from, pc, rn.Status.UnreachablePeers)
		}
		var svc v1alpha1.RDMAService
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.svc.Name}, &svc); err != nil {
			return false, err.Error()
		}
		dc := meta.FindStatusCondition(svc.Status.Conditions, v1alpha1.ConditionDegraded)
		if dc == nil || dc.Status != metav1.ConditionTrue || dc.Reason != "NodeUnreachable" || !strings.Contains(dc.Message, "node "+lost+" unreachable") {
			return false, fmt.Sprintf("RDMAService Degraded %+v", dc)
		}
		e.t.Logf("RDMANode %s: %s; RDMAService Degraded: %s", from, pc.Message, dc.Message)
		return true, ""
	})
	e.nodeSH(lost, "thaw")
	thawed = true
	e.eventually("every agent ready again", 3*time.Minute, e.agentReady)
	l := load{conns: 4, msgs: 200, size: 4096}
	e.startClient("back-client", from, e.podIP("lost-server"), l)
	e.clientOK("back-client", l, 3*time.Minute)
	for _, p := range []string{"back-client", "lost-server"} {
		e.deletePod(p)
	}
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

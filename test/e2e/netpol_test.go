//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// netpolNS is the netPolicy step's server's namespace: its clients run in
// "default", another.
const netpolNS = "rdmavisor-e2e-netpol"

// netPolicy: the agents enforce NetworkPolicies on vconns. An echo server
// in its own namespace, under a deny-all ingress policy: a client from
// "default" is refused, its error naming the policy; with an allow rule
// for "default" beside it, a client's messages all come back, every byte
// checked. The namespace, its policies and server go at the end.
func (e *env) netPolicy() {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: netpolNS}}
	if _, err := e.kube.CoreV1().Namespaces().Create(e.ctx, ns, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	defer e.dropNetpolNS()
	srv := e.serverPod("netpol-server", e.serverNode(), 4)
	srv.Namespace = netpolNS
	e.createPod(srv)
	var ip string
	e.eventually("the netpol server listening", 2*time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods(netpolNS).Get(e.ctx, srv.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ip = p.Status.PodIP
		return podReady(p) && ip != "", "not ready"
	})

	e.applyPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-all-ingress", Namespace: netpolNS},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	// The client retries refused dials until its timeout: its verdict
	// holds the last refusal.
	const denied = "netpol-denied"
	e.createPod(e.echoPod(denied, e.clientNode(), 1, "client", fmt.Sprintf("--addr=%s:%d", ip, echoPort),
		"--conns=1", "--messages=10", "--size=64", "--timeout=20s", "--verdict=/dev/termination-log"))
	v := e.clientVerdict(denied, 3*time.Minute)
	if v.OK || v.Delivered != 0 || !strings.Contains(v.Error, "deny-all-ingress") {
		e.t.Fatalf("a client from default under deny-all-ingress: %+v, want refused naming deny-all-ingress", v)
	}
	e.t.Logf("refused: %s", v.Error)
	e.deletePod(denied)

	e.applyPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "allow-default", Namespace: netpolNS},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "default"}}}}}}}})
	const allowed = "netpol-allowed"
	e.startClient(allowed, e.clientNode(), ip, defaultLoad)
	e.clientOK(allowed, defaultLoad, 3*time.Minute)
	e.deletePod(allowed)
}

func (e *env) applyPolicy(p *networkingv1.NetworkPolicy) {
	if _, err := e.kube.NetworkingV1().NetworkPolicies(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// dropNetpolNS removes the step's policies, server and namespace, and
// waits for the server's pod to go: its allocation is released before the
// next step counts the node's vconns.
func (e *env) dropNetpolNS() {
	pols := e.kube.NetworkingV1().NetworkPolicies(netpolNS)
	if err := pols.DeleteCollection(e.ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		e.t.Errorf("deleting the step's NetworkPolicies: %v", err)
	}
	err := e.kube.CoreV1().Namespaces().Delete(e.ctx, netpolNS, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Errorf("deleting namespace %s: %v", netpolNS, err)
		return
	}
	e.eventually("namespace "+netpolNS+" gone", 3*time.Minute, func() (bool, string) {
		_, err := e.kube.CoreV1().Namespaces().Get(e.ctx, netpolNS, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

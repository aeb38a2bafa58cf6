//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// leaseName is the operator's leader-election lease (cmd/operator).
const leaseName = "operator.rdmavisor.io"

var operatorPods = metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=operator"}

// operatorLeader is the operator replica holding the lease: its pod's name
// and node. controller-runtime names the holder "<pod>_<uuid>".
func (e *env) operatorLeader() (pod, node string) {
	e.t.Helper()
	e.eventually("an operator replica holds the lease", 2*time.Minute, func() (bool, string) {
		pod = e.leaseHolder()
		if pod == "" {
			return false, "no holder"
		}
		p, err := e.kube.CoreV1().Pods(namespace).Get(e.ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		node = p.Spec.NodeName
		return node != "", "not scheduled"
	})
	return pod, node
}

// leaseHolder is the pod named by the lease's holder, "" if none or
// unreadable.
func (e *env) leaseHolder() string {
	l, err := e.kube.CoordinationV1().Leases(namespace).Get(e.ctx, leaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod
}

// operatorReplicas waits for the chart's two replicas ready, on two nodes.
func (e *env) operatorReplicas() []corev1.Pod {
	e.t.Helper()
	var pods []corev1.Pod
	e.eventually("two operator replicas ready on two nodes", 3*time.Minute, func() (bool, string) {
		l, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, operatorPods)
		if err != nil {
			return false, err.Error()
		}
		nodes := map[string]bool{}
		pods = pods[:0]
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil && podReady(&p) {
				nodes[p.Spec.NodeName] = true
				pods = append(pods, p)
			}
		}
		return len(pods) == 2 && len(nodes) == 2, fmt.Sprintf("%d ready on nodes %v", len(pods), nodes)
	})
	return pods
}

// takeover waits until a replica other than old holds the lease, and
// returns it with how long it took from since. Within the lease's
// duration (15 s) and a retry (2 s) of the old leader's last renewal:
// 30 s is generous.
func (e *env) takeover(old string, since time.Time) (string, time.Duration) {
	e.t.Helper()
	var holder string
	var took time.Duration
	e.eventually("another operator replica takes the lease from "+old, 30*time.Second, func() (bool, string) {
		holder = e.leaseHolder()
		took = time.Since(since)
		return holder != "" && holder != old, "holder " + holder
	})
	return holder, took
}

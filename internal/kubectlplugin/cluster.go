// Package kubectlplugin is `kubectl rdmavisor`: status, pods, top and
// diagnose, read from the API server only. RDMAServices and RDMANodes come
// from the API; the agents' metrics over TLS through a port-forward, with
// the user's own credentials (ForwardSource), never by exec into a pod.
package kubectlplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// The labels the operator puts on every agent pod it renders
// (controllers/rdmaservice_render.go: commonLabels, selectorLabels).
const (
	labelName    = "app.kubernetes.io/name"
	labelService = "rdmavisor.io/service"
	agentAppName = "rdmavisor-agent"
	// agentContainer is the agent's container, whose port metricsPortName
	// serves /metrics (default 7472, the chart's README).
	agentContainer       = "agent"
	metricsPortName      = "metrics"
	defaultMetricsPort   = "7472"
	annotationScrapePort = "prometheus.io/port"
)

// Cluster is what the plugin reads: the API server's objects and, through
// it, the agents' metrics.
type Cluster struct {
	Kube kubernetes.Interface
	// CRs reads RDMAServices and RDMANodes.
	CRs client.Client
	// Metrics scrapes an agent pod's /metrics.
	Metrics MetricsSource
	// AgentNamespace is where the agent pods run (the operator's
	// namespace); empty: every namespace.
	AgentNamespace string
}

func (c *Cluster) services(ctx context.Context) ([]v1alpha1.RDMAService, error) {
	var l v1alpha1.RDMAServiceList
	if err := c.CRs.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("listing RDMAServices: %w", err)
	}
	slices.SortFunc(l.Items, func(a, b v1alpha1.RDMAService) int { return strings.Compare(a.Name, b.Name) })
	return l.Items, nil
}

func (c *Cluster) nodes(ctx context.Context) ([]v1alpha1.RDMANode, error) {
	var l v1alpha1.RDMANodeList
	if err := c.CRs.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("listing RDMANodes: %w", err)
	}
	slices.SortFunc(l.Items, func(a, b v1alpha1.RDMANode) int { return strings.Compare(a.Name, b.Name) })
	return l.Items, nil
}

// node is the RDMANode of a node; nil when it has none.
func (c *Cluster) node(ctx context.Context, name string) (*v1alpha1.RDMANode, error) {
	var n v1alpha1.RDMANode
	if err := c.CRs.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil, nil
		}
		return nil, fmt.Errorf("getting RDMANode %s: %w", name, err)
	}
	return &n, nil
}

// agentPods are the agent pods of every RDMAService, by node; a node with
// more than one (a rolling update) keeps the one not being deleted.
func (c *Cluster) agentPods(ctx context.Context) (map[string]*corev1.Pod, error) {
	sel := labels.SelectorFromSet(labels.Set{labelName: agentAppName}).String()
	l, err := c.Kube.CoreV1().Pods(c.AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("listing the agent pods (%s) in %s: %w", sel, namespaceName(c.AgentNamespace), err)
	}
	out := map[string]*corev1.Pod{}
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		if old, ok := out[p.Spec.NodeName]; !ok || old.DeletionTimestamp != nil {
			out[p.Spec.NodeName] = p
		}
	}
	return out, nil
}

func namespaceName(ns string) string {
	if ns == "" {
		return "every namespace"
	}
	return "namespace " + ns
}

// podReady says whether a pod runs and is Ready, and if not, why.
func podReady(p *corev1.Pod) (bool, string) {
	if p.DeletionTimestamp != nil {
		return false, "being deleted"
	}
	if p.Status.Phase != corev1.PodRunning {
		return false, "phase " + string(p.Status.Phase)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			if c.Status == corev1.ConditionTrue {
				return true, "running and ready"
			}
			why := "running, not ready"
			if c.Message != "" {
				why += ": " + c.Message
			}
			return false, why
		}
	}
	return false, "running, no Ready condition yet"
}

// condition is the status of an object's condition of type t, "Unknown"
// when it has none.
func condition(conds []metav1.Condition, t string) string {
	for _, c := range conds {
		if c.Type == t {
			return string(c.Status)
		}
	}
	return string(metav1.ConditionUnknown)
}

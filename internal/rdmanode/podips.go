package rdmanode

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ipIndex is PodIPs' index of pods by IP.
const ipIndex = "ip"

// PodIPs is which node runs each pod IP, as the API server says: an
// informer over every namespace's Pods, kept to what it needs (name,
// node, IPs, phase; labels and container ports for the NetworkPolicies
// the agent checks, Policies), indexed by IP. It implements agent.PodAddresses.
type PodIPs struct {
	inf cache.SharedIndexInformer
}

// NewPodIPs starts the informer of kube's Pods; it runs until ctx ends.
func NewPodIPs(ctx context.Context, kube kubernetes.Interface, log logr.Logger) (*PodIPs, error) {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(slimPod))
	inf := f.Core().V1().Pods().Informer()
	if err := inf.AddIndexers(cache.Indexers{ipIndex: podIPsOf}); err != nil {
		return nil, fmt.Errorf("rdmanode: pod IP index: %w", err)
	}
	if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		log.Error(err, "Watching pods for their IPs; retrying")
	}); err != nil {
		return nil, fmt.Errorf("rdmanode: pod informer: %w", err)
	}
	f.Start(ctx.Done())
	return &PodIPs{inf: inf}, nil
}

// slimPod keeps of a Pod what PodIPs reads: the informer's cache of every
// pod of the cluster is then a few hundred bytes a pod.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Containers: slimPorts(p.Spec.Containers)},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIPs: p.Status.PodIPs},
	}, nil
}

// slimPorts keeps of containers their ports (a policy's named ports
// resolve against them), in one container; nil when there are none.
func slimPorts(cs []corev1.Container) []corev1.Container {
	var ports []corev1.ContainerPort
	for _, c := range cs {
		for _, p := range c.Ports {
			ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
		}
	}
	if len(ports) == 0 {
		return nil
	}
	return []corev1.Container{{Name: "ports", Ports: ports}}
}

// podIPsOf indexes a pod by its IPs: a pod of its own network that holds
// them (not a host-network pod, whose IP is its node's; not one that
// ended, whose IP may be another pod's already).
func podIPsOf(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.HostNetwork || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	ips := make([]string, 0, len(p.Status.PodIPs))
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			ips = append(ips, a.Unmap().String())
		}
	}
	return ips, nil
}

// NodeOf returns the node of the pod that has ip. Two pods with one IP on
// different nodes (the API server has not seen one end yet) place it on
// neither.
func (p *PodIPs) NodeOf(ip netip.Addr) (string, bool) {
	objs, err := p.inf.GetIndexer().ByIndex(ipIndex, ip.Unmap().String())
	if err != nil || len(objs) == 0 {
		return "", false
	}
	node := ""
	for _, o := range objs {
		pod := o.(*corev1.Pod)
		switch {
		case node == "":
			node = pod.Spec.NodeName
		case node != pod.Spec.NodeName:
			return "", false
		}
	}
	return node, true
}

// podOf returns the running pod that has ip; nil when none, or two do.
func (p *PodIPs) podOf(ip netip.Addr) *corev1.Pod {
	objs, err := p.inf.GetIndexer().ByIndex(ipIndex, ip.Unmap().String())
	if err != nil || len(objs) != 1 {
		return nil
	}
	return objs[0].(*corev1.Pod)
}

// podNamed returns the pod "namespace/name"; nil when not known.
func (p *PodIPs) podNamed(key string) *corev1.Pod {
	o, ok, err := p.inf.GetStore().GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	pod, _ := o.(*corev1.Pod)
	return pod
}

// HasSynced reports whether the first list arrived.
func (p *PodIPs) HasSynced() bool { return p.inf.HasSynced() }

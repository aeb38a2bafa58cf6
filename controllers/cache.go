package controllers

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CacheOptions limits the manager's cache to what the reconciler reads: the
// rendered objects (by label, namespaced ones in namespace only, which is
// also all the operator's Role allows) and of Nodes only labels and taints.
func CacheOptions(namespace string) cache.Options {
	managed := labels.SelectorFromSet(labels.Set{labelManagedBy: FieldOwner})
	inNamespace := map[string]cache.Config{namespace: {}}
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&appsv1.DaemonSet{}:          {Namespaces: inNamespace, Label: managed},
		&corev1.ConfigMap{}:          {Namespaces: inNamespace, Label: managed},
		&corev1.ServiceAccount{}:     {Namespaces: inNamespace, Label: managed},
		&corev1.Secret{}:             {Namespaces: inNamespace, Label: managed},
		&rbacv1.ClusterRoleBinding{}: {Label: managed},
		&corev1.Node{}:               {Transform: stripNode},
	}}
}

// stripNode keeps what placement reads (with the container runtime, which
// decides CDI), and the addresses the signer looks up (indexNodeAddress);
// the rest of the status (images, conditions) is most of a Node's size. The
// transform owns the freshly decoded object.
func stripNode(o any) (any, error) {
	if n, ok := o.(*corev1.Node); ok {
		n.ManagedFields, n.Annotations = nil, nil
		n.Status = corev1.NodeStatus{Addresses: n.Status.Addresses,
			NodeInfo: corev1.NodeSystemInfo{ContainerRuntimeVersion: n.Status.NodeInfo.ContainerRuntimeVersion}}
	}
	return o, nil
}

package cni

import (
	"strings"
)

// PodRef identifies the pod of a CNI call, from CNI_ARGS as the kubelet's
// runtimes (containerd, CRI-O) set them.
type PodRef struct {
	UID, Namespace, Name string
}

// complete reports whether every field is set.
func (p PodRef) complete() bool { return p.UID != "" && p.Namespace != "" && p.Name != "" }

func (p PodRef) String() string { return p.Namespace + "/" + p.Name + " (uid " + p.UID + ")" }

// ParseArgs reads K8S_POD_UID, K8S_POD_NAMESPACE and K8S_POD_NAME from
// CNI_ARGS ("K=V;K=V"). Other keys, and pairs without "=", are ignored:
// runtimes add keys of their own (IgnoreUnknown, K8S_POD_INFRA_CONTAINER_ID).
func ParseArgs(args string) PodRef {
	var p PodRef
	for kv := range strings.SplitSeq(args, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "K8S_POD_UID":
			p.UID = strings.TrimSpace(v)
		case "K8S_POD_NAMESPACE":
			p.Namespace = strings.TrimSpace(v)
		case "K8S_POD_NAME":
			p.Name = strings.TrimSpace(v)
		}
	}
	return p
}

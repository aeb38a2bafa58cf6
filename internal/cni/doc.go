// Package cni owns rdmavisor-cni, the chained CNI plugin (spec 0.3.0 to
// 1.1.0) that tells the node agent which pods run on its node, and the
// installer that chains it into the node's CNI configuration.
//
// # The plugin
//
// It runs after the primary plugin (bridge, Calico, Cilium...) in the
// node's conflist. Its entry:
//
//	{"type": "rdmavisor-cni",
//	 "adminSocket": "/var/run/rdmavisor/admin.sock",  // default
//	 "failurePolicy": "fail-open",                    // or "fail-closed"
//	 "timeout": "5s"}                                 // per call to the agent
//
// ADD takes the pod's identity from CNI_ARGS (K8S_POD_UID,
// K8S_POD_NAMESPACE, K8S_POD_NAME), its IPs from prevResult (those on
// interfaces in the sandbox), CNI_NETNS and CNI_CONTAINERID, registers the
// pod with the agent over its admin socket (admin.Client.RegisterPod)
// and prints prevResult unchanged. Without prevResult it fails with
// ErrInvalidNetworkConfig: it only runs chained. When the agent cannot be
// reached, fail-open logs a warning on stderr and lets the pod start
// unregistered (its vconn calls fail), fail-closed fails with code 11 (try
// again later). A pod without its identity in CNI_ARGS (not a Kubernetes
// pod) is passed through under fail-open and refused under fail-closed.
// An agent that answers with an error fails ADD under either policy (code
// ErrAgentRejected).
//
// DEL unregisters the pod (admin.Client.UnregisterPod) and succeeds
// whenever its configuration parses: the agent being down, or not knowing
// the pod, is logged, not an error (an agent that
// restarts has forgotten its pods). A late DEL of a replaced sandbox (the
// pod is registered with another container ID) leaves the registration.
// CHECK verifies that the agent holds the registration ADD made (code
// ErrNotRegistered otherwise). STATUS asks the agent whether it is ready:
// under fail-closed, an agent down or not ready is code 50 (plugin not
// available), which stops the runtime from creating pods; under fail-open
// it is logged only, since pods start without the agent. GC unregisters
// the pods whose container is not among the runtime's valid attachments.
// Errors are CNI error results (JSON on stdout, non-zero exit), from skel.
//
// # The installer
//
// `rdmavisor-cni install` copies the binary into the node's CNI bin
// directory and chains the plugin into the primary configuration;
// `rdmavisor-cni uninstall` undoes it. With --keep (the agent DaemonSet's
// CNI sidecar) it stays, repairs the chain when the primary CNI rewrites
// its file, and uninstalls when stopped (Installer.Keep). See Installer for
// the rules.
package cni

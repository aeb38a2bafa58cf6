//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Each node's own files, and the CNI plugin's registrations with each
// node's agent.

// nodeSH runs hack/local-cluster/node.sh NODE ARGS... (E2E_NODE_SH):
// a command in a node's namespaces, freezing a node, impairing a link.
func (e *env) nodeSH(node string, args ...string) string {
	e.t.Helper()
	sh := os.Getenv("E2E_NODE_SH")
	if sh == "" {
		e.t.Fatal("E2E_NODE_SH is not set: run the suite with hack/e2e.sh")
	}
	return e.run(sh, append([]string{node}, args...)...)
}

// nodeDir is the node's copy of its hostPath directories, as the host
// (where the suite runs) sees it.
func (e *env) nodeDir(node string) string {
	return strings.TrimSpace(e.nodeSH(node, "dir"))
}

// hostCNI checks each node's own CNI directories (hostPath is per node):
// whether the plugin is in the node's configuration chain and binary
// directory. The host's, which is no node's, never has it.
func (e *env) hostCNI(want bool) {
	e.t.Helper()
	for _, node := range e.nodes {
		root := e.nodeDir(node)
		confDir, binDir := filepath.Join(root, "etc/cni/net.d"), filepath.Join(root, "opt/cni/bin")
		e.eventually(fmt.Sprintf("rdmavisor-cni installed on %s: %v", node, want), time.Minute, func() (bool, string) {
			chained := chainedIn(confDir)
			_, err := os.Stat(filepath.Join(binDir, "rdmavisor-cni"))
			return chained == want && (err == nil) == want, fmt.Sprintf("chained %v, binary %v", chained, err)
		})
	}
	if chainedIn("/etc/cni/net.d") {
		e.t.Fatal("the host's /etc/cni/net.d chains rdmavisor-cni: a node's hostPath reached the host")
	}
}

func chainedIn(confDir string) bool {
	files, _ := filepath.Glob(filepath.Join(confDir, "*.conflist"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), `"rdmavisor-cni"`) {
			return true
		}
	}
	return false
}

// cniRegistered: each pod is registered with its own node's agent only,
// and each agent's allocation sockets are on its own node only.
func (e *env) cniRegistered() {
	e.hostCNI(true)
	regs := map[string]map[string]agentPod{}
	for _, node := range e.nodes {
		regs[node] = e.registered(node)
	}
	for _, name := range []string{"echo-server", "echo-client"} {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, node := range e.nodes {
			r, ok := regs[node][string(p.UID)]
			if node != p.Spec.NodeName {
				if ok {
					e.t.Fatalf("pod %s of %s is registered with the agent on %s", name, p.Spec.NodeName, node)
				}
				continue
			}
			if !ok || r.Name != name || r.Namespace != "default" || len(r.IPs) == 0 || r.IPs[0] != p.Status.PodIP {
				e.t.Fatalf("pod %s (uid %s, IP %s): agent on %s has %+v (all: %+v)", name, p.UID, p.Status.PodIP, node, r, regs[node])
			}
		}
	}
	for _, node := range e.nodes {
		var ids []string
		for _, a := range e.allocations(node) {
			ids = append(ids, a.ID)
		}
		slices.Sort(ids)
		// (A node whose agent never allocated has no such directory.)
		socks := strings.Fields(e.nodeSH(node, "exec", "sh", "-c", "ls /run/rdmavisor/alloc 2>/dev/null || true"))
		if !slices.Equal(socks, ids) {
			e.t.Fatalf("allocation sockets on %s: %v; its agent's allocations: %v", node, socks, ids)
		}
	}
	// CNI DEL unregisters a pod that goes.
	client, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "echo-client", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	// Its allocation (bound to it: it dialed) goes too.
	var others []allocation
	for _, a := range e.allocations(client.Spec.NodeName) {
		if a.Pod != "default/echo-client" {
			others = append(others, a)
		}
	}
	e.deletePod("echo-client")
	e.eventually("client unregistered", time.Minute, func() (bool, string) {
		_, ok := e.registered(client.Spec.NodeName)[string(client.UID)]
		return !ok, "still registered"
	})
	e.allocationsBackTo(client.Spec.NodeName, others)
}

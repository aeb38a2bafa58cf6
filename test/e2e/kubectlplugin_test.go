//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/kubectlplugin"
)

// kubectlPlugin builds cmd/kubectl-rdmavisor, puts it on kubectl's PATH
// and runs `kubectl rdmavisor` status, pods, top and diagnose while the
// echo client and server of the echo step hold their allocations: every
// node Ready with its agent, the echo pods listed on their nodes with bytes
// both ways, the client's node peering with the server's, and every check
// of the client toward the server OK.
func (e *env) kubectlPlugin() {
	bin := e.t.TempDir()
	e.run("go", "build", "-o", filepath.Join(bin, "kubectl-rdmavisor"), "./cmd/kubectl-rdmavisor")
	plugin := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, e.kubectl, append([]string{"rdmavisor"}, args...)...)
		cmd.Dir = e.repo
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("kubectl rdmavisor %s: %w\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String(), err
	}
	e.pluginStatus(plugin)
	e.pluginPods(plugin)
	e.pluginTop(plugin)
	e.pluginDiagnose(plugin)
}

type pluginRun func(args ...string) (string, error)

// decode runs the plugin with -o json into v.
func (e *env) decode(plugin pluginRun, v any, args ...string) error {
	out, err := plugin(append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("kubectl rdmavisor %s -o json: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (e *env) pluginStatus(plugin pluginRun) {
	out, err := plugin("status")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("kubectl rdmavisor status\n%s", out)
	_, nodes, _ := strings.Cut(out, "NODES\n")
	ready := 0
	for _, l := range strings.Split(strings.TrimSpace(nodes), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) > 3 && f[1] == e.svc.Name && f[2] == "True" && f[3] == "Ready" {
			ready++
		}
	}
	var r kubectlplugin.StatusReport
	if err := e.decode(plugin, &r, "status"); err != nil {
		e.t.Fatal(err)
	}
	if ready != len(e.nodes) || len(r.Nodes) != len(e.nodes) || len(r.Services) != 1 || r.Services[0].Ready != "True" ||
		r.Services[0].ReadyNodes != int32(len(e.nodes)) || len(r.Errors) != 0 {
		e.t.Fatalf("status: %d of %d nodes Ready in the table; %+v", ready, len(e.nodes), r)
	}
	for _, n := range r.Nodes {
		if n.Ready != "True" || n.Agent != "Ready" || len(n.Rails) != 1 || n.Rails[0].Health != "Healthy" || len(n.UnreachablePeers) != 0 {
			e.t.Errorf("status of %s: %+v", n.Name, n)
		}
	}
}

func (e *env) pluginPods(plugin pluginRun) {
	out, err := plugin("pods", "-n", "default")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("kubectl rdmavisor pods -n default\n%s", out)
	var r kubectlplugin.PodsReport
	if err := e.decode(plugin, &r, "pods", "-n", "default"); err != nil {
		e.t.Fatal(err)
	}
	want := map[string]string{"echo-client": e.clientNode(), "echo-server": e.serverNode()}
	for _, p := range r.Pods {
		if node, ok := want[p.Pod]; ok && p.Node == node && p.BytesSent > 0 && p.BytesReceived > 0 && p.VConnQuota > 0 {
			delete(want, p.Pod)
		}
	}
	if len(want) != 0 || len(r.Errors) != 0 {
		e.t.Fatalf("pods: %v not listed on their nodes with bytes both ways: %s", want, out)
	}
	for _, pod := range []string{"echo-client", "echo-server"} {
		if !strings.Contains(out, pod) {
			e.t.Errorf("the pods table does not list %s", pod)
		}
	}
}

func (e *env) pluginTop(plugin pluginRun) {
	out, err := plugin("top", "--limit", "0")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("kubectl rdmavisor top --limit 0\n%s", out)
	var r kubectlplugin.TopReport
	if err := e.decode(plugin, &r, "top", "--by", "bytes", "--limit", "0"); err != nil {
		e.t.Fatal(err)
	}
	echo := 0
	for _, p := range r.Pods {
		if p.Namespace == "default" && (p.Pod == "echo-client" || p.Pod == "echo-server") && p.Bytes() > 0 {
			echo++
		}
	}
	peered := false
	for _, p := range r.Peers {
		peered = peered || p.Node == e.clientNode() && p.Peer == e.serverNode() && p.RCQPs+p.UCQPs+p.IngressQP > 0
	}
	if echo != 2 || !peered {
		e.t.Fatalf("top: %d echo pods with bytes, want 2; %s peers %s: %v\n%s", echo, e.clientNode(), e.serverNode(), peered, out)
	}
}

func (e *env) pluginDiagnose(plugin pluginRun) {
	args := []string{"diagnose", "echo-client", "-n", "default", "--to", "echo-server"}
	// The client's vconns closed before this step; its agent's count of
	// them may lag a moment.
	var d kubectlplugin.Diagnosis
	e.eventually("kubectl rdmavisor diagnose echo-client: every check OK", time.Minute, func() (bool, string) {
		d = kubectlplugin.Diagnosis{}
		if err := e.decode(plugin, &d, args...); err != nil {
			return false, err.Error()
		}
		return d.OK && len(d.Checks) == 13 && d.Node == e.clientNode(), fmt.Sprintf("%+v", d)
	})
	out, err := plugin(args...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Logf("kubectl rdmavisor %s\n%s", strings.Join(args, " "), out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines[1:] {
		if f := strings.Fields(l); slices.Contains(f, "FAIL") || !slices.Contains(f, "OK") {
			e.t.Errorf("diagnose: %q is not OK", l)
		}
	}
	if len(lines) != 14 {
		e.t.Errorf("diagnose printed %d checks, want 13:\n%s", len(lines)-1, out)
	}
	// A pod that does not exist fails, with exit status 1.
	if out, err := plugin("diagnose", "no-such-pod", "-n", "default"); err == nil || !strings.Contains(out, "FAIL") {
		e.t.Fatalf("diagnose of a missing pod: %v\n%s", err, out)
	}
}

//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Markers around the README's quick start on the local cluster.
const (
	quickstartBegin = "<!-- quickstart:"
	quickstartEnd   = "<!-- quickstart: end -->"
)

// quickstartScript is the fenced sh blocks of the README's local-cluster
// quick start, in order: what a newcomer types.
func quickstartScript(readme string) (string, error) {
	f, err := os.Open(readme)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var b strings.Builder
	in, fenced, blocks := false, false, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.HasPrefix(line, quickstartBegin) && line != quickstartEnd:
			in = true
		case in && line == quickstartEnd:
			if fenced {
				return "", fmt.Errorf("%s: an sh block is not closed before the quick start's end", readme)
			}
			if blocks == 0 {
				return "", fmt.Errorf("%s: no sh block in the quick start", readme)
			}
			return b.String(), nil
		case in && !fenced && line == "```sh":
			fenced = true
			blocks++
		case in && fenced && line == "```":
			fenced = false
		case in && fenced:
			b.WriteString(line + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no quick start between %q and %q", readme, quickstartBegin, quickstartEnd)
}

// quickstart runs the README's quick start literally, from a clean slate
// (after helm uninstall): make cluster-up on the running cluster (it is
// idempotent), helm install, the soft RDMAService, the two-node echo by
// Service name, the DRA echo, the agent's allocations on the echo server's
// node, and the uninstall. Each echo's grep for its verdict is in the
// README; the test also reads the verdicts and checks that the uninstall
// left nothing of the quick start.
func (e *env) quickstart() {
	script, err := quickstartScript(e.repo + "/README.md")
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", "set -x\n"+script)
	cmd.Dir = e.repo
	// A newcomer's shell: none of the suite's own settings.
	cmd.Env = []string{"HOME=" + os.Getenv("HOME"), "PATH=" + os.Getenv("PATH"), "GOFLAGS=" + os.Getenv("GOFLAGS")}
	began := time.Now()
	out, err := cmd.CombinedOutput()
	e.measured("the README's quick start, from make cluster-up (cluster already up) to helm uninstall", "%s", time.Since(began).Round(time.Second))
	if err != nil {
		e.t.Fatalf("the README's quick start failed: %v\n%s", err, tail(string(out), 80))
	}
	text := string(out)
	if n := strings.Count(text, "echo: OK 2 vconns, 2000 messages of 4096 bytes checked"); n != 2 {
		e.t.Fatalf("the quick start's two echoes printed %d verdicts, want 2:\n%s", n, tail(text, 80))
	}
	if !strings.Contains(text, `"podScoped": true`) || !strings.Contains(text, `"vconns": 8`) {
		e.t.Fatalf("the agent's allocations on the echo server's node do not show its 8 vconns:\n%s", tail(text, 80))
	}
	if got := strings.TrimSpace(e.run(e.kubectl, "get", "rdmaservices", "-o", "name")); got != "" {
		e.t.Fatalf("after the quick start's uninstall, RDMAServices remain: %s", got)
	}
	for _, name := range strings.Fields(e.run(e.kubectl, "get", "deployments,jobs,services,resourceclaimtemplates", "-n", "default", "-o", "name")) {
		if strings.Contains(name, "/echo") || strings.HasSuffix(name, "/vconns") {
			e.t.Fatalf("after the quick start's uninstall, %s remains", name)
		}
	}
	// The README deletes in the foreground: the pods are gone before the
	// service, whose DRA driver a claim's pod needs to end.
	e.eventually("the quick start's pods gone", 10*time.Second, func() (bool, string) {
		pods, err := e.kube.CoreV1().Pods("default").List(e.ctx, metav1.ListOptions{LabelSelector: "app in (echo-server, echo-client, echo-dra-server, echo-dra-client)"})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d pods left", len(pods.Items))
	})
}

// columnsMatchAgents reads the RDMAService's printer columns as kubectl
// shows them and checks ALLOCATED and OPEN against the sums of what the
// agents themselves report.
func (e *env) columnsMatchAgents(wantAllocated int) {
	e.eventually("RDMAService columns ALLOCATED and OPEN equal the agents' counts", time.Minute, func() (bool, string) {
		var allocated, open int
		for _, n := range e.nodes {
			var st struct{ Allocated, VConns int }
			e.agentState(n, "status", &st)
			allocated += st.Allocated
			open += st.VConns
		}
		if allocated != wantAllocated {
			return false, fmt.Sprintf("the agents report %d vconns allocated, want %d", allocated, wantAllocated)
		}
		out := e.run(e.kubectl, "get", "rdmaservices", e.svc.Name)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			return false, out
		}
		header, row := strings.Fields(lines[0]), strings.Fields(lines[1])
		col := map[string]int{}
		for i, h := range header {
			if i < len(row) {
				if v, err := strconv.Atoi(row[i]); err == nil {
					col[h] = v
				}
			}
		}
		if col["ALLOCATED"] != allocated || col["OPEN"] != open {
			return false, fmt.Sprintf("kubectl shows ALLOCATED %d, OPEN %d; the agents report %d and %d:\n%s", col["ALLOCATED"], col["OPEN"], allocated, open, out)
		}
		return true, ""
	})
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

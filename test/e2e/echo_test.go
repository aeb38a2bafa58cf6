//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/internal/echotest"
)

// The example program's pods (examples/echo): servers, clients, and the
// verdicts clients write.

// app is an echo program's image and what runs it in the image: the Go
// example (examples/echo), or the same program in C (examples/echo-c) or
// Python (examples/echo-py; languages_test.go), with the same flags and
// files.
type app struct {
	lang  string
	image string
	exe   []string // the command line before the program's arguments: `show` in probes and exec
}

var goEcho = app{lang: "go", image: echoImage, exe: []string{"/echo"}}

// appOf is the app a pod runs.
func appOf(p *corev1.Pod) app {
	for _, a := range []app{goEcho, cEcho, pyEcho} {
		if len(p.Spec.Containers) > 0 && p.Spec.Containers[0].Image == a.image {
			return a
		}
	}
	return goEcho
}

// echoPod is a pod of the example program requesting vconns, pinned to
// node (through the scheduler, which counts the extended resource) unless
// node is empty.
func (e *env) echoPod(name, node string, vconns int64, args ...string) *corev1.Pod {
	return e.appPod(goEcho, name, node, vconns, args...)
}

// appPod is echoPod of app a.
func (e *env) appPod(a app, name, node string, vconns int64, args ...string) *corev1.Pod {
	q := *resource.NewQuantity(vconns, resource.DecimalSI)
	var sel map[string]string
	if node != "" {
		sel = map[string]string{corev1.LabelHostname: node}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "rdmavisor-e2e"}},
		Spec: corev1.PodSpec{
			// The image's non-root user reaches its allocation's socket
			// through the service's socketGroup, as the README says.
			SecurityContext:               &corev1.PodSecurityContext{SupplementalGroups: e.socketGroups()},
			NodeSelector:                  sel,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(2)),
			Containers: []corev1.Container{{
				Name: "echo", Image: a.image, ImagePullPolicy: corev1.PullNever, Args: args,
				Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{e.resource: q}},
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true),
					AllowPrivilegeEscalation: new(false), ReadOnlyRootFilesystem: new(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
}

// socketGroups is the service's socketGroup, for a pod's
// supplementalGroups.
func (e *env) socketGroups() []int64 {
	if e.svc.Spec.SocketGroup == nil {
		return nil
	}
	return []int64{*e.svc.Spec.SocketGroup}
}

func (e *env) createPod(p *corev1.Pod) {
	if _, err := e.kube.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deletePod(name string) {
	err := e.kube.CoreV1().Pods("default").Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(1))})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	e.eventually("pod "+name+" gone", 2*time.Minute, func() (bool, string) {
		_, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func (e *env) logs(name string) string {
	b, err := e.kube.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(e.ctx)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// load is what an echo client sends: conns vconns at once, msgs messages
// of size bytes on each, every byte of every echo checked in order.
type load struct{ conns, msgs, size int }

// defaultLoad: 2 vconns, 1,000 messages of 4 KiB.
var defaultLoad = load{conns: 2, msgs: 500, size: 4096}

// exchange runs a client pod on node against the echo server on
// e.serverNode() and waits for its verdict: every byte checked.
func (e *env) exchange(client, node string, l load) {
	e.startClient(client, node, e.podIP("echo-server"), l)
	e.clientOK(client, l, 3*time.Minute)
}

// podIP is the IP of a running pod in the default namespace: a vconn
// address names a pod by its IP, as a TCP address does.
func (e *env) podIP(name string) string {
	e.t.Helper()
	var ip string
	e.eventually("pod "+name+" has an IP", 2*time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ip = p.Status.PodIP
		return ip != "", "no IP yet"
	})
	return ip
}

// startClient starts an echo client pod on node that dials the echo
// server's port at target, the server pod's IP.
func (e *env) startClient(client, node, target string, l load) {
	e.startAppClient(goEcho, client, node, target, l)
}

// startAppClient is startClient of app a.
func (e *env) startAppClient(a app, client, node, target string, l load) {
	e.createPod(e.appPod(a, client, node, int64(l.conns), "client", fmt.Sprintf("--addr=%s:%d", target, echoPort),
		fmt.Sprintf("--conns=%d", l.conns), fmt.Sprintf("--messages=%d", l.msgs), fmt.Sprintf("--size=%d", l.size),
		"--timeout=5m", "--hold", "--verdict=/dev/termination-log"))
}

// clientOK waits for the client's verdict: every byte of conns×msgs
// messages came back. The verdict is the client's file (examples/echo
// --verdict): read with `echo show` while the pod holds, from the pod's
// status once it ended.
func (e *env) clientOK(client string, l load, timeout time.Duration) {
	var v verdict
	e.eventually("client "+client+" checked every byte", timeout, func() (bool, string) {
		got, ok, why := e.verdictOf(client)
		if !ok {
			return false, why
		}
		if v = got; !v.OK {
			e.t.Fatalf("client %s failed: %s", client, v.Error)
		}
		return true, ""
	})
	if want := int64(l.conns * l.msgs); v.Sent != want || v.Delivered != want {
		e.t.Fatalf("client %s: %d messages sent and %d delivered, want %d of each", client, v.Sent, v.Delivered, want)
	}
	e.t.Logf("client %s: %d messages of %d bytes on %d vconns, every byte checked", client, v.Delivered, l.size, l.conns)
}

// verdictOf reads an echo client's verdict, if it has one yet.
func (e *env) verdictOf(client string) (v verdict, ok bool, why string) {
	p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, client, metav1.GetOptions{})
	if err != nil {
		return v, false, err.Error()
	}
	raw := ""
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Terminated != nil:
			raw = cs.State.Terminated.Message
		case cs.State.Running != nil:
			ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
			show := append(append([]string{"exec", "-n", "default", client, "--"}, appOf(p).exe...), "show", "/dev/termination-log")
			out, err := exec.CommandContext(ctx, e.kubectl, show...).Output()
			cancel()
			if err != nil {
				return v, false, fmt.Sprintf("no verdict yet (%v)", err)
			}
			raw = string(out)
		}
	}
	if raw == "" {
		return v, false, fmt.Sprintf("phase %s, no verdict", p.Status.Phase)
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return v, false, fmt.Sprintf("verdict %q: %v", raw, err)
	}
	return v, true, ""
}

// serverNode is where the echo server runs; clientNode where the first
// clients run: different nodes, so every vconn crosses two agents.
func (e *env) serverNode() string { return e.nodes[1] }
func (e *env) clientNode() string { return e.nodes[0] }

// serverVConns is the echo server's quota: enough for the clients of the
// 1,000-vconn steps, which its accepted vconns count against.
const serverVConns = 1000

// serverPod is an echo server: Ready once it listens (it writes its
// address, which a readiness probe reads with `echo show`).
func (e *env) serverPod(name, node string, vconns int64) *corev1.Pod {
	return e.appServerPod(goEcho, name, node, vconns)
}

// appServerPod is serverPod of app a.
func (e *env) appServerPod(a app, name, node string, vconns int64) *corev1.Pod {
	p := e.appPod(a, name, node, vconns, "server", fmt.Sprintf("--port=%d", echoPort), "--ready=/dev/termination-log")
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: append(append([]string(nil), a.exe...), "show", "/dev/termination-log")}}}
	return p
}

func (e *env) startServer() {
	e.createPod(e.serverPod("echo-server", e.serverNode(), serverVConns))
	e.eventually("echo server listening", 2*time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "echo-server", metav1.GetOptions{})
		return err == nil && podReady(p), fmt.Sprint(err)
	})
}

// startServerAfterRestart starts the echo server as a controller would
// just after the device plugin restarted. The node status that
// allocatableIs reads can lag the kubelet's device manager: it may still
// show the old plugin's healthy devices while the new plugin's are not
// yet, and the kubelet then refuses the pod (UnexpectedAdmissionError,
// final for a bare pod; seen once in CI). Such a pod is made again, up to
// three times, and each refusal is logged.
func (e *env) startServerAfterRestart() {
	for try := 1; ; try++ {
		e.createPod(e.serverPod("echo-server", e.serverNode(), serverVConns))
		refused := ""
		e.eventually("echo server listening", 2*time.Minute, func() (bool, string) {
			p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "echo-server", metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "UnexpectedAdmissionError" {
				refused = p.Status.Message
				return true, ""
			}
			return err == nil && podReady(p), fmt.Sprint(err)
		})
		if refused == "" {
			return
		}
		e.t.Logf("echo server refused admission (try %d): %s", try, refused)
		if try == 3 {
			e.t.Fatalf("echo server refused admission %d times: %s", try, refused)
		}
		e.deletePod("echo-server")
		// The refusals come within a second of each other: until the
		// new plugin's health probe finds the agent up and it tells the
		// kubelet, every try is refused. Give it its probe interval.
		time.Sleep(time.Duration(try) * 5 * time.Second)
	}
}

// verdict is what an echo client writes (examples/echo --verdict): read
// from the pod while it runs, or from its status once it ended.
type verdict = echotest.Verdict

// clientVerdict waits for the client pod to end and returns its verdict.
func (e *env) clientVerdict(name string, timeout time.Duration) verdict {
	e.t.Helper()
	var v verdict
	e.eventually("client "+name+" ended", timeout, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range p.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil {
				if err := json.Unmarshal([]byte(t.Message), &v); err != nil {
					e.t.Fatalf("client %s ended (exit %d) without a verdict: %q: %v", name, t.ExitCode, t.Message, err)
				}
				return true, ""
			}
		}
		return false, fmt.Sprintf("phase %s", p.Status.Phase)
	})
	return v
}

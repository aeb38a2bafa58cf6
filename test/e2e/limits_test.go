//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers"
)

// The limits step's rate: 50 messages a second, a burst of 5 (a tenth of a
// second's worth, as the agent's token bucket holds), and a burst of 500
// messages past it: at least 9.9 s, where unlimited they take well under one.
const (
	limitedRate  = 50
	limitedBurst = limitedRate / 10
	limitedMsgs  = 500
)

// limits: spec.limits reaches the agents. A patch of the service sets
// listeners to 1 and a low messageRate, which rolls the agents; then a
// second listen in the echo server's pod is refused with the limit's
// name, and a client's burst past the rate all arrives, slowed: its
// process ran at least (messages-burst)/rate (a lower bound only). The
// limits are taken out again at the end, which rolls the agents back.
func (e *env) limits() {
	e.eventually("every agent ready before the patch", 2*time.Minute, e.agentReady)
	e.patchLimits(fmt.Sprintf(`{"spec":{"limits":{"listeners":1,"messageRate":%d}}}`, limitedRate),
		"listeners: 1\n", fmt.Sprintf("messageRate: %d\n", limitedRate))
	// The agents are new: the server's agent lost its listener; start anew.
	e.deletePod("echo-server")
	e.startServerAfterRestart()

	// The server's allocation listens on its port already: a second
	// listen, by a second process on the same allocation, is refused.
	second := append(append([]string{"exec", "-n", "default", "echo-server", "--"}, goEcho.exe...), "server", fmt.Sprintf("--port=%d", echoPort+1))
	out, err := e.tryRun(e.kubectl, second...)
	if err == nil || !strings.Contains(out, "limits.listeners") {
		e.t.Fatalf("a second listen with limits.listeners 1: %v, want it refused naming limits.listeners:\n%s", err, out)
	}
	e.t.Logf("a second listen, refused: %s", strings.TrimSpace(out))

	e.burstSlowed()

	e.patchLimits(`{"spec":{"limits":null}}`)
	e.deletePod("echo-server")
	e.startServerAfterRestart()
}

// burstSlowed runs an echo client of limitedMsgs messages, one in flight
// (each echoed by the server, whose sends the rate holds too), and checks
// every one came back, none failed, in no less than the rate allows.
func (e *env) burstSlowed() {
	const name = "rated-client"
	e.createPod(e.echoPod(name, e.clientNode(), 1, "client", fmt.Sprintf("--addr=%s:%d", e.podIP("echo-server"), echoPort),
		"--conns=1", fmt.Sprintf("--messages=%d", limitedMsgs), "--size=64", "--timeout=5m", "--verdict=/dev/termination-log"))
	v := e.clientVerdict(name, 6*time.Minute)
	if !v.OK || v.Sent != limitedMsgs || v.Delivered != limitedMsgs || v.Failed != 0 {
		e.t.Fatalf("a burst past messageRate: %+v, want all %d sent and back, none failed", v, limitedMsgs)
	}
	p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	term := p.Status.ContainerStatuses[0].State.Terminated
	if term == nil {
		e.t.Fatalf("client %s ended but its container has no terminated state", name)
	}
	// The container's start (the kubelet's) and the verdict's time (the
	// process's) are both the node's clock.
	took := v.At.Sub(term.StartedAt.Time)
	least := time.Duration(limitedMsgs-limitedBurst) * time.Second / limitedRate
	if took < least {
		e.t.Fatalf("%d messages at messageRate %d (burst %d) took %v, want at least %v", limitedMsgs, limitedRate, limitedBurst, took, least)
	}
	e.t.Logf("%d messages at messageRate %d: all back in %v (at least %v)", limitedMsgs, limitedRate, took.Round(time.Millisecond), least)
	e.measured(fmt.Sprintf("%d echoed messages at messageRate %d", limitedMsgs, limitedRate), "%s", took.Round(100*time.Millisecond))
	e.deletePod(name)
}

// patchLimits merge-patches the service's spec and waits until every
// agent runs the new configuration: the agents' ConfigMap holds each of
// lines, the roll is over (Progressing False for the new generation) and
// every agent is ready.
func (e *env) patchLimits(patch string, lines ...string) {
	svc := &v1alpha1.RDMAService{}
	svc.Name = e.svc.Name
	if err := e.crs.Patch(e.ctx, svc, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		e.t.Fatalf("patching the service with %s: %v", patch, err)
	}
	e.eventually("the agents' configuration holds the limits", time.Minute, func() (bool, string) {
		cm, err := e.kube.CoreV1().ConfigMaps(namespace).Get(e.ctx, "rdmavisor-agent-"+e.svc.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		data := cm.Data["agent.yaml"]
		for _, l := range lines {
			if !strings.Contains(data, l) {
				return false, fmt.Sprintf("no %q in agent.yaml:\n%s", l, data)
			}
		}
		return true, ""
	})
	e.eventually("Progressing False once the roll is over", 5*time.Minute, func() (bool, string) {
		c := e.progressing()
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason != controllers.ReasonInvalidSpec, fmt.Sprintf("%+v", c)
	})
	e.eventually("every agent ready after the roll", 2*time.Minute, e.agentReady)
}

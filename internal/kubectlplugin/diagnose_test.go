package kubectlplugin

import (
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

func TestDiagnoseHealthy(t *testing.T) {
	code, out, errOut := newFixture().run(t, "diagnose", "echo-client", "-n", "default", "--to", "10.0.1.20:7000")
	want := `CHECK               RESULT   REASON
pod                 OK       default/echo-client (10.0.0.10) runs on node-a
vconn request       OK       requests rdmavisor.io/vconn: 2
allocation event    OK       VConnsAllocated: 2 vconns allocated by the RDMAvisor agent on node-a (allocation a1)
agent               OK       rdmavisor-system/rdmavisor-agent-default-aaaaa on node-a: running and ready
rdmanode            OK       RDMANode node-a of service default: Ready
rails               OK       node-a: rail 0:mlx5_0 up
vconn quota         OK       1 of 2 vconns open
refusals            OK       quota 0, limit 0, refused 0, address_in_use 0 since its allocation
limits              OK       RDMAService default spec.limits: sessions 4, byteRate 100Mi
destination         OK       default/echo-server (10.0.1.20) runs on node-b
destination agent   OK       rdmavisor-system/rdmavisor-agent-default-bbbbb on node-b: running and ready
peer                OK       node-b is a peer of node-a: 4 QPs, 1 vconns open, not unreachable
destination rails   OK       node-b: rail 0:mlx5_0 up
`
	if code != 0 || out != want || errOut != "" {
		t.Errorf("diagnose: exit %d, stderr %q, stdout\n%s\nwant\n%s", code, errOut, out, want)
	}
}

func TestDiagnoseJSON(t *testing.T) {
	f := newFixture()
	f.svc.Spec.Limits = nil
	code, out, _ := f.run(t, "diagnose", "echo-client", "-n", "default", "--to", "echo-server", "-o", "json")
	var d struct {
		Namespace, Pod, Node, To string
		OK                       bool
		Checks                   []struct {
			Name   string `json:"name"`
			OK     bool   `json:"ok"`
			Reason string `json:"reason"`
		}
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != 0 {
		t.Fatalf("diagnose -o json: exit %d, %v\n%s", code, err, out)
	}
	if d.Namespace != "default" || d.Pod != "echo-client" || d.Node != "node-a" || d.To != "echo-server" || !d.OK || len(d.Checks) != 13 {
		t.Errorf("diagnose -o json: %s", out)
	}
	if c := d.Checks[8]; c.Name != "limits" || !c.OK || c.Reason != "RDMAService default sets no spec.limits: the agent's defaults" {
		t.Errorf("limits check %+v", c)
	}
}

// Each failure fails the checks it should, and no other; the command
// exits 1 and says how many failed.
func TestDiagnoseFailures(t *testing.T) {
	tests := []struct {
		name   string
		to     string
		change func(*fixture)
		fail   map[string]string // check → its reason
	}{
		{"agent not ready", "10.0.1.20", func(f *fixture) {
			f.agents["node-a"].Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Message: "containers with unready status: [agent]"}
		}, map[string]string{"agent": "rdmavisor-system/rdmavisor-agent-default-aaaaa on node-a: running, not ready: containers with unready status: [agent]"}},
		{"destination's agent gone", "10.0.1.20", func(f *fixture) {
			delete(f.agents, "node-b")
		}, map[string]string{"destination agent": "no agent pod on node-b"}},
		{"peer unreachable", "default/echo-server", func(f *fixture) {
			st := &f.nodes["node-a"].Status
			st.UnreachablePeers = []string{"node-b"}
			st.Conditions[2] = metav1.Condition{Type: v1alpha1.ConditionPeersReachable, Status: metav1.ConditionFalse, Reason: "PeersLost", Message: "node-b"}
		}, map[string]string{
			"rdmanode": "RDMANode node-a: PeersReachable False (PeersLost: node-b)",
			"peer":     "RDMANode node-a lists node-b in unreachablePeers: its agent stopped answering heartbeats",
		}},
		{"destination rail down", "10.0.1.20", func(f *fixture) {
			d := &f.nodes["node-b"].Status.Devices[0]
			d.Health, d.Message = v1alpha1.DeviceUnhealthy, "port 1 DOWN"
		}, map[string]string{"destination rails": "node-b: rail 0:mlx5_0 Unhealthy (port 1 DOWN)"}},
		{"source rail down in the metrics", "10.0.1.20", func(f *fixture) {
			f.metrics["node-a"].rails["0"] = 0
		}, map[string]string{"rails": "node-a: rail 0:mlx5_0 port down (rdmavisor_rail_up 0)"}},
		{"quota exhausted", "10.0.1.20", func(f *fixture) {
			p := f.metrics["node-a"].pods[0]
			p.VConnsOpen, p.Refusals = 2, map[string]uint64{"quota": 3}
		}, map[string]string{
			"vconn quota": "2 of 2 vconns open: the pod's next dial or accept is refused (quota)",
			"refusals":    "quota 3, limit 0, refused 0, address_in_use 0 since its allocation: its vconns or the dialed pod's were all in use",
		}},
		{"nothing listening", "10.0.1.20", func(f *fixture) {
			f.metrics["node-a"].pods[0].Refusals = map[string]uint64{"refused": 2, "address_in_use": 1}
		}, map[string]string{"refusals": "quota 0, limit 0, refused 2, address_in_use 1 since its allocation: nothing listened at an address it dialed"}},
		{"no request, no allocation", "", func(f *fixture) {
			f.tenants[0].Spec.Containers[0].Resources = corev1.ResourceRequirements{}
			f.events = nil
			f.metrics["node-a"].pods = nil
		}, map[string]string{
			"vconn request":    "the pod requests no rdmavisor.io/* resource and no resource claim: it gets no vconns",
			"allocation event": "no VConnsAllocated Event: no agent allocated vconns to this pod (yet)",
			"vconn quota":      "the agent on node-a holds no allocation bound to default/echo-client",
		}},
		{"no such destination", "10.9.9.9:7000", func(*fixture) {},
			map[string]string{"destination": "no running pod has IP 10.9.9.9 (a vconn address names a pod by its IP)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture()
			tt.change(f)
			args := []string{"diagnose", "echo-client", "-n", "default", "-o", "json"}
			if tt.to != "" {
				args = append(args, "--to", tt.to)
			}
			code, out, errOut := f.run(t, args...)
			var d Diagnosis
			if err := json.Unmarshal([]byte(out), &d); err != nil {
				t.Fatalf("%v\n%s%s", err, out, errOut)
			}
			got := map[string]string{}
			for _, c := range d.Checks {
				if !c.OK {
					got[c.Name] = c.Reason
				}
			}
			if !mapsEqual(got, tt.fail) {
				t.Errorf("failed checks %q, want %q", got, tt.fail)
			}
			wantErr := (&ChecksFailed{Failed: len(tt.fail), Total: len(d.Checks)}).Error() + "\n"
			if code != 1 || d.OK || errOut != wantErr {
				t.Errorf("exit %d, ok %v, stderr %q, want 1, false, %q", code, d.OK, errOut, wantErr)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// A pod that is not found, or not scheduled, ends the checks there.
func TestDiagnoseNoPod(t *testing.T) {
	f := newFixture()
	code, out, _ := f.run(t, "diagnose", "nope", "-n", "default")
	if code != 1 || out != "CHECK   RESULT   REASON\npod     FAIL     pod default/nope not found\n" {
		t.Errorf("exit %d\n%s", code, out)
	}
	f.tenants[0].Spec.NodeName = ""
	f.tenants[0].Status = corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled,
		Status: corev1.ConditionFalse, Message: "0/2 nodes are available: 2 Insufficient rdmavisor.io/vconn."}}}
	code, out, _ = f.run(t, "diagnose", "echo-client", "-n", "default", "-o", "json")
	var d Diagnosis
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != 1 || len(d.Checks) != 1 ||
		d.Checks[0].Reason != "default/echo-client is not scheduled: 0/2 nodes are available: 2 Insufficient rdmavisor.io/vconn." {
		t.Errorf("exit %d, %v\n%s", code, err, out)
	}
}

// The same node: the agent connects the pods itself.
func TestDiagnoseSameNode(t *testing.T) {
	f := newFixture()
	f.tenants[1].Spec.NodeName = "node-a"
	code, out, _ := f.run(t, "diagnose", "echo-client", "-n", "default", "--to", "echo-server", "-o", "json")
	var d Diagnosis
	if err := json.Unmarshal([]byte(out), &d); err != nil || code != 0 {
		t.Fatalf("exit %d, %v\n%s", code, err, out)
	}
	i := slices.IndexFunc(d.Checks, func(c Check) bool { return c.Name == "peer" })
	if i < 0 || d.Checks[i].Reason != "same node node-a: its agent connects the two pods itself" {
		t.Errorf("checks %+v", d.Checks)
	}
}

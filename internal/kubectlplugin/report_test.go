package kubectlplugin

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestStatusTable(t *testing.T) {
	code, out, errOut := newFixture().run(t, "status")
	want := `SERVICES
SERVICE   READY   PROGRESSING   DEGRADED   NODES   CAPACITY   ALLOCATED   OPEN
default   True    False         False      2/2     2048       10          2

NODES
NODE     SERVICE   READY   AGENT   RAILS              PEERS    ALLOCATED   OPEN   CAPACITY
node-a   default   True    Ready   0:mlx5_0=Healthy   node-b   2           1      1024
node-b   default   True    Ready   0:mlx5_0=Healthy   node-a   8           1      1024
`
	if code != 0 || out != want || errOut != "" {
		t.Errorf("status: exit %d, stderr %q, stdout\n%s\nwant\n%s", code, errOut, out, want)
	}
}

// A node whose agent is not ready, whose metrics cannot be read, and whose
// RDMANode lists its peer unreachable with a rail down.
func TestStatusDegraded(t *testing.T) {
	f := newFixture()
	f.agents["node-b"].Status.Conditions[0].Status = "False"
	f.metrics["node-b"].err = errors.New("connection refused")
	nb := &f.nodes["node-b"].Status
	nb.UnreachablePeers = []string{"node-a"}
	nb.Conditions[0].Status = "False"
	nb.Devices = append(nb.Devices, nb.Devices[0])
	nb.Devices[1].Name, nb.Devices[1].Rail, nb.Devices[1].Health = "mlx5_1", 1, "Unhealthy"
	code, out, errOut := f.run(t, "status")
	want := `NODE     SERVICE   READY   AGENT      RAILS                                 PEERS                   ALLOCATED   OPEN   CAPACITY
node-a   default   True    Ready      0:mlx5_0=Healthy                      node-b                  2           1      1024
node-b   default   False   NotReady   0:mlx5_0=Healthy,1:mlx5_1=Unhealthy   node-a(unreachable),?   8           1      1024
`
	_, nodes, _ := strings.Cut(out, "NODES\n")
	if code != 0 || nodes != want {
		t.Errorf("status: exit %d, nodes\n%s\nwant\n%s", code, nodes, want)
	}
	if errOut != "warning: metrics of the agent on node-b: connection refused\n" {
		t.Errorf("stderr %q", errOut)
	}
	// JSON carries the failure instead of a warning.
	code, out, errOut = f.run(t, "status", "-o", "json")
	var r StatusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 || errOut != "" {
		t.Fatalf("status -o json: exit %d, %v, stderr %q", code, err, errOut)
	}
	if len(r.Errors) != 1 || r.Errors[0] != "node-b: connection refused" || r.Nodes[1].PeersKnown || r.Nodes[1].Peers[0].Reachable {
		t.Errorf("status -o json: %+v", r)
	}
}

// The JSON and YAML forms: the report's fields by their JSON names.
func TestStatusJSONShape(t *testing.T) {
	f := newFixture()
	for _, format := range []string{"json", "yaml"} {
		code, out, _ := f.run(t, "status", "-o", format)
		var m map[string]any
		if err := yaml.Unmarshal([]byte(out), &m); err != nil || code != 0 {
			t.Fatalf("status -o %s: exit %d, %v\n%s", format, code, err, out)
		}
		svc := m["services"].([]any)[0].(map[string]any)
		node := m["nodes"].([]any)[1].(map[string]any)
		peer := node["peers"].([]any)[0].(map[string]any)
		rail := node["rails"].([]any)[0].(map[string]any)
		got := []any{svc["name"], svc["ready"], svc["nodes"], svc["vconnsAllocated"], svc["vconnsOpen"],
			node["name"], node["ready"], node["agent"], node["vconnsAllocated"], node["unreachablePeers"],
			peer["name"], peer["reachable"], peer["qps"], rail["device"], rail["health"]}
		want := []any{"default", "True", "2/2", float64(10), float64(2),
			"node-b", "True", "Ready", float64(8), []any{},
			"node-a", true, float64(4), "mlx5_0", "Healthy"}
		if b, w := mustJSON(t, got), mustJSON(t, want); b != w {
			t.Errorf("status -o %s: %s, want %s", format, b, w)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPodsTable(t *testing.T) {
	code, out, errOut := newFixture().run(t, "pods")
	want := `NAMESPACE   POD           NODE     OPEN   QUOTA   MSGS-SENT   BYTES-SENT   MSGS-RECV   BYTES-RECV   REFUSALS   DROPPED
-           <unbound>     node-b   0      4       0           0            0           0            0          0
default     echo-client   node-a   1      2       1000        4096000      1000        4096000      0          0
default     echo-server   node-b   1      8       1000        4096000      1000        4096000      0          0
team-b      batch-0       node-b   0      4       0           0            0           0            4          0
`
	if code != 0 || out != want || errOut != "" {
		t.Errorf("pods: exit %d, stderr %q, stdout\n%s\nwant\n%s", code, errOut, out, want)
	}
}

func TestPodsJSON(t *testing.T) {
	f := newFixture()
	f.metrics["node-b"].pods[2].DroppedSent = 5
	code, out, _ := f.run(t, "pods", "-n", "team-b", "-o", "json")
	want := `{
  "pods": [
    {
      "namespace": "team-b",
      "pod": "batch-0",
      "node": "node-b",
      "vconnsOpen": 0,
      "vconnQuota": 4,
      "messagesSent": 0,
      "bytesSent": 0,
      "messagesReceived": 0,
      "bytesReceived": 0,
      "droppedSent": 5,
      "droppedReceived": 0,
      "refusals": {
        "address_in_use": 0,
        "limit": 0,
        "quota": 1,
        "refused": 3
      }
    }
  ]
}
`
	if code != 0 || out != want {
		t.Errorf("pods -n team-b -o json: exit %d\n%s\nwant\n%s", code, out, want)
	}
}

func TestTop(t *testing.T) {
	f := newFixture()
	f.metrics["node-a"].pods[0].MessagesSent = 3000 // the client's messages outnumber the server's, its bytes equal
	f.metrics["node-b"].peers = append(f.metrics["node-b"].peers, &PeerTraffic{Peer: "node-c", Rail: "0", VConns: 7, UCQPs: 2})
	code, out, _ := f.run(t, "top")
	want := `PODS (by bytes, since their allocation)
NAMESPACE   POD           NODE     BYTES     MESSAGES   REFUSALS   OPEN   QUOTA
default     echo-client   node-a   8192000   4000       0          1      2
default     echo-server   node-b   8192000   2000       0          1      8
-           <unbound>     node-b   0         0          0          0      4
team-b      batch-0       node-b   0         0          4          0      4

PEERS (by vconns open)
NODE     PEER     RAIL   VCONNS   RC-QPS   UC-QPS   INGRESS-QPS
node-b   node-c   0      7        0        2        0
node-a   node-b   0      1        2        0        2
node-b   node-a   0      1        2        0        2
`
	if code != 0 || out != want {
		t.Errorf("top: exit %d\n%s\nwant\n%s", code, out, want)
	}
	code, out, _ = f.run(t, "top", "--by", "refusals", "--limit", "1", "-o", "json")
	var r TopReport
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 {
		t.Fatalf("top --by refusals: exit %d, %v", code, err)
	}
	if r.By != "refusals" || len(r.Pods) != 1 || r.Pods[0].Pod != "batch-0" || len(r.Peers) != 1 || r.Peers[0].Peer != "node-c" {
		t.Errorf("top --by refusals --limit 1: %s", out)
	}
	code, out, _ = f.run(t, "top", "--by", "messages", "-n", "default", "-o", "json")
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 || len(r.Pods) != 2 || r.Pods[1].Pod != "echo-server" {
		t.Errorf("top --by messages -n default: exit %d, %v\n%s", code, err, out)
	}
	if code, _, errOut := f.run(t, "top", "--by", "latency"); code != 1 || !strings.Contains(errOut, `unknown --by "latency"`) {
		t.Errorf("top --by latency: exit %d, %q", code, errOut)
	}
	if code, _, errOut := f.run(t, "pods", "-o", "wide"); code != 1 || !strings.Contains(errOut, `unknown output format "wide"`) {
		t.Errorf("pods -o wide: exit %d, %q", code, errOut)
	}
}

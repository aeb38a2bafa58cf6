package cni

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

const testPrevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"veth0","mac":"aa:bb:cc:dd:ee:ff"},{"name":"eth0","sandbox":"/var/run/netns/pod"}],` +
	`"ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1","interface":1},{"address":"fd00::3/64","interface":1},{"address":"192.168.0.9/32","interface":0}]}`

func netConf(version, sock, policy, prev string) string {
	s := fmt.Sprintf(`{"cniVersion":%q,"name":"testnet","type":"rdmavisor-cni","adminSocket":%q,"failurePolicy":%q`, version, sock, policy)
	if prev != "" {
		s += `,"prevResult":` + prev
	}
	return s + "}"
}

func podEnv(containerID, uid string) []string {
	return []string{"CNI_CONTAINERID=" + containerID, "CNI_NETNS=/var/run/netns/pod", "CNI_IFNAME=eth0", "CNI_NETNS_OVERRIDE=1",
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-" + uid + ";K8S_POD_UID=" + uid + ";K8S_POD_INFRA_CONTAINER_ID=" + containerID}
}

func sameJSON(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("output is not JSON (%v): %q", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("output %s, want %s", got, want)
	}
}

// TestPluginBadInput runs the built binary on bad input: each gets a CNI
// error result with the right code, a non-zero exit, and registers nothing.
func TestPluginBadInput(t *testing.T) {
	bin := buildPlugin(t)
	node := startAgent(t)
	sock := node.Config.AdminSocket
	down := filepath.Join(t.TempDir(), "no-agent.sock")
	env := podEnv("ctr-bad", "uid-bad")
	for _, tc := range []struct {
		name, command, stdin string
		env                  []string
		code                 uint
		msg                  string
	}{
		{name: "malformed stdin", stdin: `{"cniVersion": "1.0.0", "name": `, code: types.ErrDecodingFailure, msg: "unmarshal"},
		{name: "not an object", stdin: `[1,2]`, code: types.ErrDecodingFailure},
		{name: "missing prevResult", stdin: netConf("1.0.0", sock, "fail-open", ""), code: types.ErrInvalidNetworkConfig, msg: "prevResult missing"},
		{name: "unknown cniVersion", stdin: netConf("9.9.9", sock, "fail-open", testPrevResult), code: types.ErrIncompatibleCNIVersion, msg: "incompatible CNI version"},
		{name: "pre-chaining cniVersion", stdin: netConf("0.2.0", sock, "fail-open", testPrevResult), code: types.ErrIncompatibleCNIVersion},
		{name: "bad failurePolicy", stdin: netConf("1.0.0", sock, "fail-maybe", testPrevResult), code: types.ErrInvalidNetworkConfig, msg: "invalid configuration"},
		{name: "relative adminSocket", stdin: netConf("1.0.0", "admin.sock", "fail-open", testPrevResult), code: types.ErrInvalidNetworkConfig},
		{name: "bad timeout", stdin: strings.Replace(netConf("1.0.0", sock, "fail-open", testPrevResult), `"name"`, `"timeout":"forever","name"`, 1), code: types.ErrInvalidNetworkConfig},
		{name: "no network name", stdin: strings.Replace(netConf("1.0.0", sock, "fail-open", testPrevResult), `"testnet"`, `""`, 1), code: types.ErrInvalidNetworkConfig, msg: "missing network name"},
		{name: "malformed prevResult", stdin: netConf("1.0.0", sock, "fail-open", `{"cniVersion":"1.0.0","ips":"10.0.0.1"}`), code: types.ErrDecodingFailure, msg: "prevResult"},
		{name: "CHECK before 0.4.0", command: "CHECK", stdin: netConf("0.3.1", sock, "fail-open", testPrevResult), code: types.ErrIncompatibleCNIVersion},
		{name: "fail-closed, agent down", stdin: netConf("1.0.0", down, "fail-closed", testPrevResult), code: types.ErrTryAgainLater, msg: "unreachable"},
		{name: "fail-closed, no pod in CNI_ARGS", stdin: netConf("1.0.0", sock, "fail-closed", testPrevResult),
			env: []string{"CNI_CONTAINERID=ctr-bad", "CNI_NETNS=/x", "CNI_IFNAME=eth0", "CNI_NETNS_OVERRIDE=1"}, code: types.ErrInvalidEnvironmentVariables},
		{name: "agent rejects the pod", stdin: netConf("1.0.0", sock, "fail-open", testPrevResult), env: podEnv("ctr-bad", "bad/uid"), code: ErrAgentRejected, msg: "refused"},
		{name: "STATUS, fail-closed, agent down", command: "STATUS", stdin: netConf("1.1.0", down, "fail-closed", ""), code: types.ErrPluginNotAvailable},
		{name: "unknown CNI_COMMAND", command: "BOGUS", stdin: netConf("1.0.0", sock, "fail-open", testPrevResult), code: types.ErrInvalidEnvironmentVariables},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.command == "" {
				tc.command = "ADD"
			}
			if tc.env == nil {
				tc.env = env
			}
			r := execPlugin(bin, tc.command, tc.stdin, tc.env...)
			e := r.cniError(t)
			if e.Code != tc.code || !strings.Contains(e.Msg+" "+e.Details, tc.msg) {
				t.Errorf("error %d %q (%s), want code %d with %q", e.Code, e.Msg, e.Details, tc.code, tc.msg)
			}
			if p := pods(node); len(p) != 0 {
				t.Errorf("the agent registered %v", p)
			}
		})
	}
}

// TestPluginCommands runs the built binary's ADD, CHECK, DEL, STATUS and
// VERSION against a real agent, directly (no netns: CNI_NETNS_OVERRIDE).
func TestPluginCommands(t *testing.T) {
	bin := buildPlugin(t)
	node := startAgent(t)
	sock := node.Config.AdminSocket
	conf := netConf("1.0.0", sock, "fail-closed", testPrevResult)
	env := podEnv("ctr-1", "uid-1")

	r := execPlugin(bin, "ADD", conf, env...)
	if r.err != nil {
		t.Fatalf("ADD: %v: %s %s", r.err, r.stdout, r.stderr)
	}
	sameJSON(t, r.stdout, testPrevResult) // passed through unchanged
	p := pods(node)
	if len(p) != 1 || p[0].UID != "uid-1" || p[0].Namespace != "default" || p[0].Name != "pod-uid-1" ||
		p[0].ContainerID != "ctr-1" || p[0].Netns != "/var/run/netns/pod" || !reflect.DeepEqual(p[0].IPs, []string{"10.1.2.3", "fd00::3"}) {
		t.Fatalf("agent pods %+v, want uid-1 with its sandbox IPs", p)
	}
	if r := execPlugin(bin, "CHECK", conf, env...); r.err != nil {
		t.Fatalf("CHECK: %v: %s", r.err, r.stdout)
	}
	other := strings.Replace(conf, "10.1.2.3", "10.1.2.4", 1)
	if e := execPlugin(bin, "CHECK", other, env...).cniError(t); e.Code != ErrNotRegistered || !strings.Contains(e.Details, "ips") {
		t.Errorf("CHECK with other IPs: %+v, want ErrNotRegistered about ips", e)
	}
	if r := execPlugin(bin, "STATUS", netConf("1.1.0", sock, "fail-closed", ""), "CNI_NETNS_OVERRIDE=1"); r.err != nil {
		t.Errorf("STATUS: %v: %s", r.err, r.stdout)
	}
	r = execPlugin(bin, "VERSION", "")
	sameJSON(t, r.stdout, `{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}`)

	// A late DEL of a replaced sandbox leaves the registration.
	if r := execPlugin(bin, "DEL", conf, podEnv("ctr-old", "uid-1")...); r.err != nil {
		t.Fatalf("stale DEL: %v: %s", r.err, r.stdout)
	}
	if len(pods(node)) != 1 {
		t.Fatal("a stale DEL unregistered the pod")
	}
	for i := range 2 { // DEL is idempotent
		if r := execPlugin(bin, "DEL", conf, env...); r.err != nil {
			t.Fatalf("DEL %d: %v: %s", i, r.err, r.stdout)
		}
		if p := pods(node); len(p) != 0 {
			t.Fatalf("after DEL %d the agent still has %+v", i, p)
		}
	}
	if e := execPlugin(bin, "CHECK", conf, env...).cniError(t); e.Code != ErrNotRegistered {
		t.Errorf("CHECK after DEL: %+v, want ErrNotRegistered", e)
	}

	// DEL without the pod's UID: by container ID.
	if r := execPlugin(bin, "ADD", conf, podEnv("ctr-2", "uid-2")...); r.err != nil {
		t.Fatal(r.err)
	}
	if r := execPlugin(bin, "DEL", conf, "CNI_CONTAINERID=ctr-2", "CNI_IFNAME=eth0", "CNI_NETNS_OVERRIDE=1"); r.err != nil {
		t.Fatal(r.err)
	}
	if p := pods(node); len(p) != 0 {
		t.Fatalf("DEL by container ID left %+v", p)
	}

	// GC drops the pods whose container is not a valid attachment.
	for _, id := range []string{"ctr-3", "ctr-4"} {
		if r := execPlugin(bin, "ADD", conf, podEnv(id, "uid-"+id)...); r.err != nil {
			t.Fatal(r.err)
		}
	}
	gc := strings.Replace(netConf("1.1.0", sock, "fail-closed", ""), `"name"`, `"cni.dev/valid-attachments":[{"containerID":"ctr-3","ifname":"eth0"}],"name"`, 1)
	if r := execPlugin(bin, "GC", gc); r.err != nil {
		t.Fatalf("GC: %v: %s", r.err, r.stdout)
	}
	if p := pods(node); len(p) != 1 || p[0].ContainerID != "ctr-3" {
		t.Fatalf("after GC the agent has %+v, want ctr-3 only", p)
	}

	// Not a Kubernetes pod (no identity in CNI_ARGS): fail-open passes it
	// through unregistered.
	noPod := []string{"CNI_CONTAINERID=ctr-x", "CNI_NETNS=/x", "CNI_IFNAME=eth0", "CNI_NETNS_OVERRIDE=1"}
	r = execPlugin(bin, "ADD", netConf("1.0.0", sock, "fail-open", testPrevResult), noPod...)
	if r.err != nil {
		t.Fatalf("fail-open ADD without CNI_ARGS: %v: %s", r.err, r.stdout)
	}
	sameJSON(t, r.stdout, testPrevResult)
	if p := pods(node); len(p) != 1 {
		t.Fatalf("ADD without CNI_ARGS registered something: %+v", p)
	}

	// The agent goes down.
	if err := node.Stop(); err != nil {
		t.Fatal(err)
	}
	if r := execPlugin(bin, "DEL", conf, podEnv("ctr-3", "uid-ctr-3")...); r.err != nil {
		t.Errorf("DEL with the agent down: %v: %s", r.err, r.stdout)
	}
	open := netConf("1.0.0", sock, "fail-open", testPrevResult)
	r = execPlugin(bin, "ADD", open, env...)
	if r.err != nil {
		t.Fatalf("fail-open ADD with the agent down: %v: %s", r.err, r.stdout)
	}
	sameJSON(t, r.stdout, testPrevResult)
	if !strings.Contains(r.stderr, "unreachable") {
		t.Errorf("fail-open ADD did not warn on stderr: %q", r.stderr)
	}
	if r := execPlugin(bin, "CHECK", open, env...); r.err != nil {
		t.Errorf("fail-open CHECK with the agent down: %v: %s", r.err, r.stdout)
	}
	if r := execPlugin(bin, "STATUS", netConf("1.1.0", sock, "fail-open", "")); r.err != nil {
		t.Errorf("fail-open STATUS with the agent down: %v: %s", r.err, r.stdout)
	}
	if e := execPlugin(bin, "STATUS", netConf("1.1.0", sock, "fail-closed", "")).cniError(t); e.Code != types.ErrPluginNotAvailable {
		t.Errorf("fail-closed STATUS with the agent down: %+v", e)
	}
	if e := execPlugin(bin, "CHECK", conf, env...).cniError(t); e.Code != types.ErrTryAgainLater {
		t.Errorf("fail-closed CHECK with the agent down: %+v", e)
	}
	if e := execPlugin(bin, "ADD", conf, env...).cniError(t); e.Code != types.ErrTryAgainLater {
		t.Errorf("fail-closed ADD with the agent down: %+v", e)
	}
}

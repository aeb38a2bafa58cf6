package cni

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// TestChainedWithReferencePlugins installs rdmavisor-cni with its installer
// (the init container's command line) behind the reference bridge +
// host-local plugins, and runs the chain through libcni, as containerd
// does, in a network namespace the test creates.
func TestChainedWithReferencePlugins(t *testing.T) {
	requireRoot(t)
	requirePlugins(t, "bridge", "host-local", "loopback")
	bin := buildPlugin(t)
	node := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dir := t.TempDir()
	binDir, confDir, dataDir, cacheDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "ipam"), filepath.Join(dir, "cache")
	for _, d := range []string{binDir, confDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	brName := "rvcni" + hex.EncodeToString(rnd[:]) // 13 bytes: fits IFNAMSIZ
	subnet := fmt.Sprintf("10.251.%d.0/24", rnd[0])
	t.Cleanup(func() {
		if _, err := net.InterfaceByName(brName); err != nil {
			return
		}
		if out, err := exec.Command("ip", "link", "del", brName).CombinedOutput(); err != nil {
			t.Errorf("deleting the bridge %s: %v: %s", brName, err, out)
		}
	})
	primary := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "rvtest",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": false, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]]}}
  ]
}
`, brName, dataDir, subnet)
	confFile := filepath.Join(confDir, "10-rvtest.conflist")
	if err := os.WriteFile(confFile, []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgData, err := node.Config.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgFile, cfgData, 0o644); err != nil {
		t.Fatal(err)
	}
	installer := func(args ...string) {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("rdmavisor-cni %v: %v\n%s", args, err, out)
		}
	}
	installer("install", "--config="+cfgFile, "--cni-bin-dir="+binDir, "--cni-conf-dir="+confDir)

	list, err := libcni.ConfListFromFile(confFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.Plugins); n != 2 || list.Plugins[1].Network.Type != PluginType {
		t.Fatalf("installed conflist has %d plugins", n)
	}
	cninet := libcni.NewCNIConfigWithCacheDir([]string{binDir, systemPlugins}, cacheDir, nil)
	netns := newNetns(t)
	lo, err := libcni.ConfFromBytes([]byte(`{"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}`))
	if err != nil {
		t.Fatal(err)
	}
	rt := func(containerID, uid string) *libcni.RuntimeConf {
		return &libcni.RuntimeConf{ContainerID: containerID, NetNS: netns, IfName: "eth0", CacheDir: cacheDir,
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", "web-" + uid},
				{"K8S_POD_UID", uid}, {"K8S_POD_INFRA_CONTAINER_ID", containerID}}}
	}
	pod1 := rt("rvtest-ctr-1", "uid-1")
	if _, err := cninet.AddNetwork(ctx, lo, pod1); err != nil {
		t.Fatalf("loopback ADD: %v", err)
	}
	res, err := cninet.AddNetworkList(ctx, list, pod1)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	_, ipnet, _ := net.ParseCIDR(subnet)
	if len(r.IPs) != 1 || !ipnet.Contains(r.IPs[0].Address.IP) {
		t.Fatalf("ADD result %+v: want one IP in %s from host-local", r, subnet)
	}
	ip := r.IPs[0].Address.IP.String()
	p := pods(node)
	if len(p) != 1 || p[0].UID != "uid-1" || p[0].Namespace != "default" || p[0].Name != "web-uid-1" ||
		!slices.Equal(p[0].IPs, []string{ip}) || p[0].Netns != netns || p[0].ContainerID != pod1.ContainerID {
		t.Fatalf("the agent knows %+v, want uid-1 with %s (host-local's IP)", p, ip)
	}
	if err := cninet.CheckNetworkList(ctx, list, pod1); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	status, err := libcni.ConfListFromBytes(fmt.Appendf(nil, `{"cniVersion": "1.1.0", "name": "st", "plugins": [{"type": %q, "adminSocket": %q, "failurePolicy": "fail-closed"}]}`,
		PluginType, node.Config.AdminSocket))
	if err != nil {
		t.Fatal(err)
	}
	if err := cninet.GetStatusNetworkList(ctx, status); err != nil {
		t.Fatalf("STATUS with the agent up: %v", err)
	}
	for i := range 2 {
		if err := cninet.DelNetworkList(ctx, list, pod1); err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
		if p := pods(node); len(p) != 0 {
			t.Fatalf("after DEL %d the agent knows %+v", i, p)
		}
	}
	if leases, _ := filepath.Glob(filepath.Join(dataDir, "rvtest", ip)); len(leases) != 0 {
		t.Errorf("host-local still holds %s after DEL", ip)
	}

	// DEL with the agent stopped succeeds.
	pod2 := rt("rvtest-ctr-2", "uid-2")
	if _, err := cninet.AddNetworkList(ctx, list, pod2); err != nil {
		t.Fatalf("ADD pod 2: %v", err)
	}
	if len(pods(node)) != 1 {
		t.Fatal("pod 2 not registered")
	}
	if err := node.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := cninet.DelNetworkList(ctx, list, pod2); err != nil {
		t.Fatalf("DEL with the agent stopped: %v", err)
	}
	var te *types.Error
	if err := cninet.GetStatusNetworkList(ctx, status); !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with the agent stopped: %v, want code %d", err, types.ErrPluginNotAvailable)
	}
	if err := cninet.DelNetwork(ctx, lo, pod1); err != nil {
		t.Errorf("loopback DEL: %v", err)
	}

	installer("uninstall", "--cni-bin-dir="+binDir, "--cni-conf-dir="+confDir)
	if b, _ := os.ReadFile(confFile); string(b) != primary {
		t.Errorf("uninstall left\n%s\nwant the original\n%s", b, primary)
	}
	if _, err := os.Stat(filepath.Join(binDir, PluginType)); !os.IsNotExist(err) {
		t.Errorf("uninstall left the binary: %v", err)
	}
}

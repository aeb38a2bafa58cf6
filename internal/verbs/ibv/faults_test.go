//go:build ibverbs && linux

package ibv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// The fault cases need a lossy network between two rxe devices, and rxe
// injects no faults itself. So they run on two rxe devices on the two ends
// of a veth pair, with netem on both ends. Both ends are in the guest's one
// network namespace (rxe in this kernel listens only there), so policy
// routing sends the packets between their addresses over the pair instead
// of lo: outbound, a table per destination routes it out of the other end;
// inbound, the local table is looked up first for packets that arrive on
// the pair. rxe then sees a foreign MAC and puts each packet on the wire.
// Only in the VM, which may change the network and add devices.
var (
	faultyNet     sync.Once
	faultyDevs    = [2]string{"rxf0", "rxf1"}
	faultyLinks   = [2]string{"rvf0", "rvf1"}
	faultyAddrs   = [2]string{"10.200.0.1", "10.200.0.2"}
	faultyNetFail string
)

func setUpFaultyNet() error {
	steps := [][]string{{"ip", "link", "add", faultyLinks[0], "type", "veth", "peer", "name", faultyLinks[1]}}
	for i, l := range faultyLinks {
		o := 1 - i
		steps = append(steps,
			[]string{"ip", "addr", "add", faultyAddrs[i] + "/32", "dev", l},
			[]string{"ip", "link", "set", l, "up"},
			[]string{"ip", "rule", "add", "pref", fmt.Sprint(1 + i), "iif", l, "lookup", "local"},
			[]string{"ip", "rule", "add", "pref", fmt.Sprint(10 + i), "to", faultyAddrs[o], "lookup", fmt.Sprint(200 + i)},
			[]string{"ip", "route", "add", faultyAddrs[o], "dev", l, "table", fmt.Sprint(200 + i)})
	}
	steps = append(steps,
		[]string{"ip", "rule", "del", "pref", "0"},
		[]string{"ip", "rule", "add", "pref", "100", "lookup", "local"},
		[]string{"modprobe", "sch_netem"})
	for i, l := range faultyLinks {
		steps = append(steps, []string{"rdma", "link", "add", faultyDevs[i], "type", "rxe", "netdev", l})
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, out)
		}
	}
	// Neighbours are permanent: address resolution must not be lost.
	for i, l := range faultyLinks {
		mac, err := os.ReadFile("/sys/class/net/" + faultyLinks[1-i] + "/address")
		if err != nil {
			return err
		}
		s := []string{"ip", "neigh", "replace", faultyAddrs[1-i], "lladdr", strings.TrimSpace(string(mac)), "dev", l, "nud", "permanent"}
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(s, " "), err, out)
		}
	}
	// Packets from one of our own addresses arrive on the pair: not martians.
	for _, c := range []string{"all", "default", faultyLinks[0], faultyLinks[1]} {
		for k, v := range map[string]string{"rp_filter": "0", "accept_local": "1"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+c+"/"+k, []byte(v), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func faultyDevices(t testing.TB, n int, o verbstest.Options) []verbs.Device {
	t.Helper()
	if os.Getenv("RDMAVISOR_RXE_VM") != "1" {
		t.Fatalf("the fault cases change the network and add rxe devices: only in the rxe VM (RDMAVISOR_RXE_VM=1)")
	}
	if n != len(faultyDevs) {
		t.Fatalf("the lossy wire joins %d devices; the case asks for %d", len(faultyDevs), n)
	}
	faultyNet.Do(func() {
		if err := setUpFaultyNet(); err != nil {
			faultyNetFail = err.Error()
		}
	})
	if faultyNetFail != "" {
		t.Fatalf("lossy wire: %s", faultyNetFail)
	}
	netem := []string{"loss", pct(o.Loss), "duplicate", pct(o.Duplicate)}
	if o.Reorder > 0 {
		// netem reorders by sending some packets at once and delaying
		// the rest.
		netem = append(netem, "delay", "1ms", "reorder", pct(o.Reorder))
	}
	for _, l := range faultyLinks {
		args := append([]string{"qdisc", "replace", "dev", l, "root", "netem"}, netem...)
		if out, err := exec.Command("tc", args...).CombinedOutput(); err != nil {
			t.Fatalf("tc %s: %v: %s", strings.Join(args, " "), err, out)
		}
		t.Cleanup(func() {
			out, _ := exec.Command("tc", "-s", "qdisc", "show", "dev", l).CombinedOutput()
			t.Logf("%s: %s", l, strings.Join(strings.Fields(string(out)), " "))
			_ = exec.Command("tc", "qdisc", "del", "dev", l, "root").Run()
		})
	}
	devs := make([]verbs.Device, n)
	for i := range devs {
		devs[i] = open(t, Config{Names: []string{faultyDevs[i]}})
	}
	return devs
}

func pct(p float64) string { return fmt.Sprintf("%g%%", 100*p) }

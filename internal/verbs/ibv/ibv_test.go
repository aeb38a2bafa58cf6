//go:build ibverbs && linux

package ibv

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/verbstest"
)

// The tests need an RDMA device: hack/rxe-vm runs them in a VM on the
// kernel's rxe0 with RDMAVISOR_RXE_VM=1, where a missing device fails
// instead of skipping. RDMAVISOR_IBV_DEVICE names the device (default rxe0).
func testDevice(t testing.TB) string {
	t.Helper()
	name := os.Getenv("RDMAVISOR_IBV_DEVICE")
	if name == "" {
		name = "rxe0"
	}
	infos, err := List()
	if err != nil || len(infos) == 0 {
		if os.Getenv("RDMAVISOR_RXE_VM") == "1" {
			t.Fatalf("no RDMA device (List: %v, %v)", infos, err)
		}
		t.Skipf("no RDMA device on this host (List: %v); make test-rxe runs this in a VM", err)
	}
	return name
}

func open(t testing.TB, cfg Config) verbs.Device {
	t.Helper()
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("close device: %v", err)
		}
	})
	return d
}

// TestConformance runs the verbs suite. With one rxe device, the n devices
// are n opens of it (separate contexts): rxe loops packets between QPs of
// one device back in the kernel. The fault cases run on faultyDevices.
func TestConformance(t *testing.T) {
	name := testDevice(t)
	verbstest.Run(t, func(t testing.TB, n int, o verbstest.Options) ([]verbs.Device, bool) {
		if o.Faulty() {
			return faultyDevices(t, n, o), true
		}
		devs := make([]verbs.Device, n)
		for i := range devs {
			devs[i] = open(t, Config{Names: []string{name}})
		}
		return devs, true
	})
}

func TestList(t *testing.T) {
	name := testDevice(t)
	infos, err := List()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, i := range infos {
		t.Logf("%v", i)
		found = found || i.Name == name
	}
	if !found {
		t.Errorf("List() lacks %s: %v", name, infos)
	}
}

func TestOpenSelect(t *testing.T) {
	name := testDevice(t)
	d := open(t, Config{Names: []string{name}})
	a := d.Attr()
	infos, _ := List()
	var info DeviceInfo
	for _, i := range infos {
		if i.Name == name {
			info = i
		}
	}
	t.Run("ByGUID", func(t *testing.T) {
		open(t, Config{GUIDs: []string{formatGUID(info.NodeGUID)}})
	})
	t.Run("ByVendor", func(t *testing.T) {
		x := open(t, Config{Vendors: []string{strings.ToUpper(a.Vendor)}})
		if x.Attr().Vendor != a.Vendor {
			t.Errorf("vendor %q, want %q", x.Attr().Vendor, a.Vendor)
		}
	})
	t.Run("AutoGIDIsRoCEv2", func(t *testing.T) {
		g, err := d.GID(0)
		if err != nil {
			t.Fatal(err)
		}
		if !g.Addr().Is4() {
			t.Errorf("automatic GID %v: want the IPv4-mapped RoCE v2 GID", g)
		}
	})
	t.Run("ExplicitGIDIndex", func(t *testing.T) {
		sel := d.(*device).gidSel
		x := open(t, Config{Names: []string{name}, GIDIndex: &sel})
		g0, _ := d.GID(0)
		g1, _ := x.GID(0)
		if g0 != g1 {
			t.Errorf("GID(0) with GIDIndex %d: %v, want %v", sel, g1, g0)
		}
	})
}

func TestOpenErrors(t *testing.T) {
	name := testDevice(t)
	_, err := Open(Config{Names: []string{"mlx5_nonexistent"}})
	if err == nil || !strings.Contains(err.Error(), "mlx5_nonexistent") || !strings.Contains(err.Error(), name) {
		t.Errorf("Open of a missing device: %v; want an error naming it and listing %s", err, name)
	}
	t.Logf("missing device: %v", err)
	big := 1 << 20
	_, err = Open(Config{Names: []string{name}, GIDIndex: &big})
	if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("GID index %d: %v; want ErrInvalid, out of range", big, err)
	}
	t.Logf("GID index out of range: %v", err)
	_, err = Open(Config{Names: []string{name}, GUIDs: []string{"zz"}})
	if !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("bad GUID: %v; want ErrInvalid", err)
	}
	_, err = Open(Config{Names: []string{name}, Port: 2})
	if !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("port 2: %v; want ErrInvalid", err)
	}
}

// TestOpenPortDown: an rxe device on a netdev that is down has its port
// DOWN; Open says so. Only in the VM, which can create the netdev.
func TestOpenPortDown(t *testing.T) {
	testDevice(t)
	if os.Getenv("RDMAVISOR_RXE_VM") != "1" {
		t.Skip("needs the rxe VM (creates a netdev and an rxe device)")
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	run("ip", "link", "add", "rvdown0", "type", "dummy")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "rvdown0").Run() })
	run("rdma", "link", "add", "rxedown", "type", "rxe", "netdev", "rvdown0")
	t.Cleanup(func() { _ = exec.Command("rdma", "link", "del", "rxedown").Run() })
	_, err := Open(Config{Names: []string{"rxedown"}})
	if err == nil || !strings.Contains(err.Error(), "not ACTIVE") {
		t.Errorf("Open of a device whose port is down: %v; want an error saying the port is not ACTIVE", err)
	}
	t.Logf("port down: %v", err)
}

// TestPollAllocs: Poll allocates nothing, empty or not.
func TestPollAllocs(t *testing.T) {
	name := testDevice(t)
	devs := []verbs.Device{open(t, Config{Names: []string{name}}), open(t, Config{Names: []string{name}})}
	p := verbstest.NewPair(t, devs[0], devs[1], verbstest.PairConfig{})
	src := verbstest.RegMR(t, p.PDA, 4096, verbs.AccessLocalWrite)
	dst := verbstest.RegMR(t, p.PDB, 4096, verbs.AccessLocalWrite)
	wcs := make([]verbs.WC, 16)
	recv := []verbs.RecvWR{verbstest.RecvWR(1, verbstest.SGE(dst, 0, 64))}
	send := []verbs.SendWR{verbstest.SendWR(2, verbs.WRSend, verbstest.SGE(src, 0, 64))}
	if a := testing.AllocsPerRun(100, func() { p.CQA.Poll(wcs) }); a != 0 {
		t.Errorf("Poll of an empty CQ: %v allocations", a)
	}
	a := testing.AllocsPerRun(50, func() {
		if _, err := p.B.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := p.A.PostSend(send); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 1; got += p.CQB.Poll(wcs) {
		}
		for got := 0; got < 1; got += p.CQA.Poll(wcs) {
		}
	})
	if a != 0 {
		t.Errorf("PostRecv, PostSend and Poll of one message: %v allocations", a)
	}
}

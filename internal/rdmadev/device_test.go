package rdmadev_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev/rdmadevtest"
)

// A tree of a RoCE and an InfiniBand device on two NUMA nodes reads back
// as the kernel would describe them.
func TestListTwoNUMA(t *testing.T) {
	root := rdmadevtest.TwoNUMA(t)
	devs, err := rdmadev.List(root, rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	want := []rdmadev.Device{
		{Name: "mlx5_0", NodeGUID: "0c42:a103:0065:7a10", PCIAddress: "0000:3b:00.0", PCIRoot: "pci0000:3a", NUMANode: 0,
			NetDevs: []string{"ens1f0"},
			Ports: []rdmadev.Port{{Number: 1, LinkLayer: rdmadev.Ethernet, State: "ACTIVE", GIDs: []rdmadev.GID{
				{Index: 0, Addr: netip.MustParseAddr("fe80::e42:a1ff:fe65:7a10"), Type: rdmadev.GIDTypeRoCEv2, NetDev: "ens1f0"},
				{Index: 2, Addr: netip.MustParseAddr("::ffff:10.0.0.1"), Type: rdmadev.GIDTypeRoCEv2, NetDev: "ens1f0"},
			}}}},
		{Name: "mlx5_1", NodeGUID: "0c42:a103:0065:7b20", PCIAddress: "0000:86:00.0", PCIRoot: "pci0000:85", NUMANode: 1,
			NetDevs: []string{"ib0"},
			Ports: []rdmadev.Port{{Number: 1, LinkLayer: rdmadev.InfiniBand, State: "ACTIVE", LID: 0x1a, GIDs: []rdmadev.GID{
				{Index: 0, Addr: netip.MustParseAddr("fe80::c42:a103:65:7b20"), Type: rdmadev.GIDTypeIB},
			}}}},
	}
	if !reflect.DeepEqual(devs, want) {
		t.Fatalf("List:\n got %+v\nwant %+v", devs, want)
	}
	if tr := devs[0].Ports[0].Transport(); tr != "RoCE" {
		t.Errorf("mlx5_0 transport %q, want RoCE", tr)
	}
	if tr := devs[1].Ports[0].Transport(); tr != "InfiniBand" {
		t.Errorf("mlx5_1 transport %q, want InfiniBand", tr)
	}
}

// A software device has no PCI function: no location, NUMA node -1, and
// its parent network device.
func TestReadSoftDevice(t *testing.T) {
	root := t.TempDir()
	rdmadevtest.Write(t, root, rdmadevtest.Device{Name: "rxe0", NodeGUID: "5054:00ff:fe12:3456", LinkLayer: "Ethernet",
		State: "4: ACTIVE", LID: "0x0", NetDev: "eth0", GIDs: []string{"fe80:0000:0000:0000:5054:00ff:fe12:3456"}, GIDType: "RoCE v2"})
	d, err := rdmadev.Read(root, "rxe0")
	if err != nil {
		t.Fatal(err)
	}
	if d.PCIAddress != "" || d.PCIRoot != "" || d.NUMANode != -1 || !reflect.DeepEqual(d.NetDevs, []string{"eth0"}) {
		t.Fatalf("rxe0: %+v, want no PCI location, NUMA node -1, netdev eth0", d)
	}
}

// A PCI device whose platform has no NUMA file is on node -1.
func TestReadNoNUMAFile(t *testing.T) {
	root := t.TempDir()
	d := rdmadevtest.RoCE()
	d.NUMANode = ""
	rdmadevtest.Write(t, root, d)
	got, err := rdmadev.Read(root, d.Name)
	if err != nil || got.NUMANode != -1 || got.PCIRoot != "pci0000:3a" {
		t.Fatalf("Read: %+v, %v; want NUMA -1 under pci0000:3a", got, err)
	}
}

// No RDMA class directory: no devices, no error. An unknown name is
// ErrNotFound, and a name cannot leave the class directory.
func TestNamesAndNotFound(t *testing.T) {
	root := t.TempDir()
	if names, err := rdmadev.Names(root); err != nil || len(names) != 0 {
		t.Fatalf("Names of an empty tree: %v, %v", names, err)
	}
	root = rdmadevtest.TwoNUMA(t)
	if names, err := rdmadev.Names(root); err != nil || !reflect.DeepEqual(names, []string{"mlx5_0", "mlx5_1"}) {
		t.Fatalf("Names: %v, %v", names, err)
	}
	for _, name := range []string{"mlx5_9", "", "..", "../../devices"} {
		if _, err := rdmadev.Read(root, name); !errors.Is(err, rdmadev.ErrNotFound) {
			t.Errorf("Read(%q): %v, want ErrNotFound", name, err)
		}
	}
}

// A malformed file fails the read with an error naming the file and
// what is wrong with it.
func TestReadMalformed(t *testing.T) {
	dev := filepath.Join("devices", "pci0000:3a", "0000:3a:00.0", "0000:3b:00.0")
	ib := filepath.Join(dev, "infiniband", "mlx5_0")
	port := filepath.Join(ib, "ports", "1")
	for _, c := range []struct {
		file, content, want string
	}{
		{filepath.Join(ib, "node_guid"), "0c42:a103:0065\n", "want 4 groups of 4 hex digits"},
		{filepath.Join(ib, "node_guid"), "", "empty file"},
		{filepath.Join(dev, "numa_node"), "two\n", `NUMA node "two\n": want -1 or 0..1023`},
		{filepath.Join(dev, "numa_node"), "-2\n", "want -1 or 0..1023"},
		{filepath.Join(port, "link_layer"), "Token Ring\n", `link layer "Token Ring\n": want InfiniBand or Ethernet`},
		{filepath.Join(port, "state"), "ACTIVE\n", `want "N: NAME"`},
		{filepath.Join(port, "lid"), "26\n", "want 0x and hex digits"},
		{filepath.Join(port, "lid"), "0x12345\n", "at most 4 hex digits"},
		{filepath.Join(port, "gids", "0"), "fe80::1\n", "want 8 groups of 4 hex digits"},
		{filepath.Join(port, "gids", "2"), "0000:0000:0000:0000:0000:ffff:0a00:zz01\n", "a group is not 4 hex digits"},
		{filepath.Join(port, "gid_attrs", "types", "0"), "RoCE v3\n", `GID type "RoCE v3\n"`},
		{filepath.Join(port, "gids", "x"), "fe80:0000:0000:0000:0e42:a1ff:fe65:7a10\n", `GID index "x"`},
		{filepath.Join(ib, "ports", "0", "lid"), "0x0\n", `port "0": want a number 1..255`},
		{filepath.Join(port, "state"), strings.Repeat("4", 5000), "longer than 4096 bytes"},
	} {
		t.Run(filepath.Base(c.file)+" "+c.want, func(t *testing.T) {
			root := rdmadevtest.TwoNUMA(t)
			path := filepath.Join(root, c.file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := rdmadev.List(root, rdmadev.Names)
			var fe *rdmadev.FileError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("List: %v, want a *FileError with %q", err, c.want)
			}
			if !strings.Contains(c.file, "/"+filepath.Base(fe.Path)) || !strings.Contains(err.Error(), "mlx5_0") {
				t.Errorf("error %q names %q, want the file %s", err, fe.Path, c.file)
			}
		})
	}
	// A missing port attribute is an error too: the kernel always has it.
	root := rdmadevtest.TwoNUMA(t)
	if err := os.Remove(filepath.Join(root, port, "link_layer")); err != nil {
		t.Fatal(err)
	}
	if _, err := rdmadev.Read(root, "mlx5_0"); err == nil || !strings.Contains(err.Error(), "link_layer") {
		t.Fatalf("Read without link_layer: %v", err)
	}
}

// The kernel's netlink view and sysfs list the same devices on this
// machine (none where no RDMA module is loaded).
func TestNetlinkNamesMatchSysfs(t *testing.T) {
	nl, err := rdmadev.NetlinkNames("")
	if err != nil {
		t.Fatal(err)
	}
	fs, err := rdmadev.Names("/sys")
	if err != nil {
		t.Fatal(err)
	}
	if len(nl) != len(fs) || (len(nl) > 0 && !reflect.DeepEqual(nl, fs)) {
		t.Fatalf("netlink lists %v, sysfs %v", nl, fs)
	}
	if _, err := rdmadev.List("/sys", rdmadev.NetlinkNames); err != nil {
		t.Fatalf("List of this machine: %v", err)
	}
}

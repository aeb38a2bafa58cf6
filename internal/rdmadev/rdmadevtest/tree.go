// Package rdmadevtest writes fake sysfs trees of RDMA devices for tests
// of package rdmadev and its users: the layout the kernel has, links
// included, under a temporary root.
package rdmadevtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Device is a fake RDMA device with one port.
type Device struct {
	Name string
	// PCIAddress ("0000:3b:00.0") and PCIRoot ("pci0000:3a"); empty for a
	// software device, which hangs under devices/virtual.
	PCIAddress, PCIRoot string
	// NUMANode is written to numa_node as is ("0", "-1"); empty: no file.
	NUMANode  string
	NodeGUID  string
	LinkLayer string // "Ethernet" or "InfiniBand"
	State     string // "4: ACTIVE"
	LID       string // "0x0"
	NetDev    string // the function's network device, or a soft device's parent
	// GIDs are the GID table, by index; "" is an empty slot (all zeros).
	GIDs []string
	// GIDType is every used GID's type ("RoCE v2", "IB/RoCE v1").
	GIDType string
}

// RoCE is a RoCE device on NUMA node 0 under PCI root pci0000:3a, with
// an empty GID slot and an IPv4-mapped RoCE v2 GID.
func RoCE() Device {
	return Device{Name: "mlx5_0", PCIAddress: "0000:3b:00.0", PCIRoot: "pci0000:3a", NUMANode: "0",
		NodeGUID: "0c42:a103:0065:7a10", LinkLayer: "Ethernet", State: "4: ACTIVE", LID: "0x0", NetDev: "ens1f0",
		GIDs:    []string{"fe80:0000:0000:0000:0e42:a1ff:fe65:7a10", "", "0000:0000:0000:0000:0000:ffff:0a00:0001"},
		GIDType: "RoCE v2"}
}

// InfiniBand is an InfiniBand device on NUMA node 1 under PCI root
// pci0000:85, LID 0x1a.
func InfiniBand() Device {
	return Device{Name: "mlx5_1", PCIAddress: "0000:86:00.0", PCIRoot: "pci0000:85", NUMANode: "1",
		NodeGUID: "0c42:a103:0065:7b20", LinkLayer: "InfiniBand", State: "4: ACTIVE", LID: "0x1a", NetDev: "ib0",
		GIDs:    []string{"fe80:0000:0000:0000:0c42:a103:0065:7b20"},
		GIDType: "IB/RoCE v1"}
}

// TwoNUMA writes a tree of two devices on two NUMA nodes, RoCE (mlx5_0,
// node 0) and InfiniBand (mlx5_1, node 1), and returns its root.
func TwoNUMA(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	Write(t, root, RoCE())
	Write(t, root, InfiniBand())
	return root
}

// Write adds d to the tree at root.
func Write(t testing.TB, root string, d Device) {
	t.Helper()
	if err := write(root, d); err != nil {
		t.Fatalf("rdmadevtest: writing %s: %v", d.Name, err)
	}
}

func write(root string, d Device) error {
	var fn, dev string // the PCI function's directory, the device's
	if d.PCIAddress != "" {
		fn = filepath.Join(root, "devices", d.PCIRoot, d.PCIRoot[3:]+":00.0", d.PCIAddress)
		dev = filepath.Join(fn, "infiniband", d.Name)
	} else {
		dev = filepath.Join(root, "devices", "virtual", "infiniband", d.Name)
	}
	port := filepath.Join(dev, "ports", "1")
	files := map[string]string{
		filepath.Join(dev, "node_guid"):   d.NodeGUID + "\n",
		filepath.Join(dev, "node_type"):   "1: CA\n",
		filepath.Join(port, "link_layer"): d.LinkLayer + "\n",
		filepath.Join(port, "state"):      d.State + "\n",
		filepath.Join(port, "lid"):        d.LID + "\n",
	}
	if fn != "" {
		if d.NUMANode != "" {
			files[filepath.Join(fn, "numa_node")] = d.NUMANode + "\n"
		}
		if d.NetDev != "" {
			files[filepath.Join(fn, "net", d.NetDev, "ifindex")] = "2\n"
		}
	} else if d.NetDev != "" {
		files[filepath.Join(dev, "parent")] = d.NetDev + "\n"
	}
	for i, g := range d.GIDs {
		idx := strconv.Itoa(i)
		if g == "" {
			g = "0000:0000:0000:0000:0000:0000:0000:0000"
		} else {
			files[filepath.Join(port, "gid_attrs", "types", idx)] = d.GIDType + "\n"
			if d.LinkLayer == "Ethernet" {
				files[filepath.Join(port, "gid_attrs", "ndevs", idx)] = d.NetDev + "\n"
			}
		}
		files[filepath.Join(port, "gids", idx)] = g + "\n"
	}
	if err := os.MkdirAll(filepath.Join(port, "gids"), 0o755); err != nil {
		return err
	}
	for p, s := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return err
		}
	}
	// The links the kernel makes: class/infiniband/NAME to the device,
	// and the device's "device" to its PCI function.
	if fn != "" {
		if err := os.Symlink(filepath.Join("..", "..", "..", d.PCIAddress), filepath.Join(dev, "device")); err != nil {
			return err
		}
	}
	class := filepath.Join(root, "class", "infiniband")
	if err := os.MkdirAll(class, 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(class, dev)
	if err != nil {
		return fmt.Errorf("linking %s: %w", d.Name, err)
	}
	return os.Symlink(rel, filepath.Join(class, d.Name))
}

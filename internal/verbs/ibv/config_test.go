//go:build ibverbs && linux

package ibv

import (
	"errors"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func TestConfigMatches(t *testing.T) {
	mlx := DeviceInfo{Name: "mlx5_0", NodeGUID: 0x0002c9030044ed90, VendorID: 0x02c9, Vendor: "mellanox"}
	rxe := DeviceInfo{Name: "rxe0", NodeGUID: 0x505400fffe990002, VendorID: 0xffffff, Vendor: "0xffffff"}
	for _, c := range []struct {
		name     string
		cfg      Config
		mlx, rxe bool
	}{
		{"Any", Config{}, true, true},
		{"Name", Config{Names: []string{"rxe0"}}, false, true},
		{"GUIDPlain", Config{GUIDs: []string{"0002c9030044ed90"}}, true, false},
		{"GUIDColons", Config{GUIDs: []string{"0002:c903:0044:ed90"}}, true, false},
		{"GUID0x", Config{GUIDs: []string{"0x505400FFFE990002"}}, false, true},
		{"VendorName", Config{Vendors: []string{"Mellanox"}}, true, false},
		{"VendorID", Config{Vendors: []string{"0x02C9"}}, true, false},
		{"VendorIDRxe", Config{Vendors: []string{"0xffffff"}}, false, true},
		{"NameAndVendor", Config{Names: []string{"rxe0"}, Vendors: []string{"mellanox"}}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, d := range []struct {
				info DeviceInfo
				want bool
			}{{mlx, c.mlx}, {rxe, c.rxe}} {
				got, err := c.cfg.matches(d.info)
				if err != nil || got != d.want {
					t.Errorf("%+v matches %s: %v, %v; want %v", c.cfg, d.info.Name, got, err, d.want)
				}
			}
		})
	}
	if _, err := (&Config{GUIDs: []string{"xyz"}}).matches(mlx); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("GUID xyz: %v, want ErrInvalid", err)
	}
}

// TestOpenWithoutDevices: on a host without RDMA devices, Open says so.
func TestOpenWithoutDevices(t *testing.T) {
	if infos, err := List(); err != nil || len(infos) > 0 {
		t.Skipf("this host has RDMA devices (%v, %v)", infos, err)
	}
	_, err := Open(Config{Names: []string{"mlx5_0"}})
	if err == nil || !strings.Contains(err.Error(), "mlx5_0") || !strings.Contains(err.Error(), "devices present: none") {
		t.Errorf("Open without devices: %v", err)
	}
}

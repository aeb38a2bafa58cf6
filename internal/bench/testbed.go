package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// testbed is two soft devices that reach each other: on an in-memory
// fabric, or on UDP sockets bound to 127.0.0.2 and 127.0.0.3.
type testbed struct {
	fabric *wire.Fabric
	devs   [2]*soft.Device
}

var testbedAddrs = [2]string{"127.0.0.2", "127.0.0.3"}

func openTestbed(kind string) (*testbed, error) { return openTestbedNIC(kind, false) }

// openTestbedNIC opens a testbed whose devices model a NIC (soft.NICModel,
// with its published defaults) if nic.
func openTestbedNIC(kind string, nic bool) (_ *testbed, err error) {
	tb := &testbed{}
	defer func() {
		if err != nil {
			err = errors.Join(err, tb.close())
		}
	}()
	var ws [2]wire.Wire
	switch kind {
	case "udp":
		// Both devices use one port, as RoCEv2 does; pick one no other
		// run on this host holds.
		for try := 0; ; try++ {
			port := uint16(20000 + rand.IntN(40000))
			var errs []error
			for i, a := range testbedAddrs {
				u, err := wire.ListenUDP(wire.UDPConfig{Addr: netip.MustParseAddr(a), Port: port})
				errs = append(errs, err)
				if err == nil {
					ws[i] = u
				}
			}
			if err := errors.Join(errs...); err == nil {
				break
			} else if try == 20 {
				return nil, fmt.Errorf("bench: UDP wires: %w", err)
			}
			for i, w := range ws {
				if w != nil {
					_ = w.Close()
					ws[i] = nil
				}
			}
		}
	default:
		tb.fabric = wire.NewFabric(wire.Faults{})
		for i, a := range testbedAddrs {
			if ws[i], err = tb.fabric.Attach(verbs.GIDFromAddr(netip.MustParseAddr(a))); err != nil {
				return nil, err
			}
		}
	}
	for i, w := range ws {
		cfg := soft.Config{Name: fmt.Sprintf("soft%d", i), Wire: w}
		if nic {
			m := soft.DefaultNICModel()
			cfg.NIC = &m
		}
		d, err := soft.Open(cfg)
		if err != nil {
			for _, w := range ws[i:] {
				_ = w.Close()
			}
			return nil, err
		}
		tb.devs[i] = d
	}
	return tb, nil
}

// close closes the devices; whatever was opened on them must be closed
// first.
func (tb *testbed) close() error {
	var errs []error
	for _, d := range tb.devs {
		if d != nil {
			errs = append(errs, d.Close())
		}
	}
	if tb.fabric != nil {
		errs = append(errs, tb.fabric.Close())
	}
	return errors.Join(errs...)
}

// raiseFileLimit raises the descriptor limit as far as the system allows:
// every naive connection end has a CQ, and so a completion channel. It
// returns the limit in force.
func raiseFileLimit() (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	want := uint64(1 << 20)
	if b, err := readUint("/proc/sys/fs/nr_open"); err == nil && b < want {
		want = b
	}
	if lim.Max < want {
		raised := unix.Rlimit{Cur: want, Max: want}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err == nil {
			return want, nil
		}
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return lim.Cur, err
		}
	}
	return lim.Cur, nil
}

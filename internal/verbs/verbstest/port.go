package verbstest

import (
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// PortDevice is a device whose port state a test sets: its link going
// down (SetPortState(verbs.PortStateDown)) or the device disappearing
// (Unplug), for code that watches ports. Everything else is the wrapped
// device's, which keeps carrying traffic: the fake changes what the
// port reports, not what it does.
type PortDevice struct {
	verbs.Device

	mu    sync.Mutex
	state verbs.PortState // 0 (NOP): the wrapped device's; guarded by mu
	err   error           // guarded by mu
}

// WithPort wraps dev, reporting its own port state until the test sets
// one.
func WithPort(dev verbs.Device) *PortDevice { return &PortDevice{Device: dev} }

// SetPortState makes PortState report s, and clears Unplug's error;
// verbs.PortStateNOP hands back to the wrapped device's state.
func (d *PortDevice) SetPortState(s verbs.PortState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state, d.err = s, nil
}

// Unplug makes PortState fail with err, as the query of a hot-unplugged
// device fails (EIO, ENODEV).
func (d *PortDevice) Unplug(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.err = err
}

// PortState reports what the test set, or else the wrapped device's.
func (d *PortDevice) PortState() (verbs.PortState, error) {
	d.mu.Lock()
	st, err := d.state, d.err
	d.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if st != verbs.PortStateNOP {
		return st, nil
	}
	return d.Device.PortState()
}

package agent

import (
	"errors"
	"fmt"
)

// errLimit: a request would take an allocation past one of its limits
// (config.Limits); the application gets frame.CodeLimit.
var errLimit = errors.New("allocation limit reached")

// held is what an allocation holds against its limits; guarded by
// allocation.mu.
type held struct {
	listeners   int
	regions     int
	regionBytes int64
}

// claimListener counts a listener against the allocation's limit.
func (al *allocation) claimListener() error {
	lim := al.a.cfg.Limits.Listeners
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.held.listeners >= lim {
		return fmt.Errorf("listen: allocation %s already listens on %d ports (limits.listeners): %w", al.id, lim, errLimit)
	}
	al.held.listeners++
	return nil
}

func (al *allocation) releaseListener() {
	al.mu.Lock()
	al.held.listeners--
	al.mu.Unlock()
}

// claimRegion counts an exported region of size bytes against the
// allocation's limits.
func (al *allocation) claimRegion(size int64) error {
	l := al.a.cfg.Limits
	al.mu.Lock()
	defer al.mu.Unlock()
	switch {
	case al.held.regions >= l.Regions:
		return fmt.Errorf("export: allocation %s already exports %d regions (limits.regions): %w", al.id, l.Regions, errLimit)
	case size > l.RegionBytes-al.held.regionBytes:
		return fmt.Errorf("export %d bytes: allocation %s has %d of its %d bytes of regions registered (limits.regionBytes): %w",
			size, al.id, al.held.regionBytes, l.RegionBytes, errLimit)
	}
	al.held.regions++
	al.held.regionBytes += size
	return nil
}

func (al *allocation) releaseRegion(size int64) {
	al.mu.Lock()
	al.held.regions--
	al.held.regionBytes -= size
	al.mu.Unlock()
}

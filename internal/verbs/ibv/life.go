//go:build ibverbs && linux

package ibv

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// life is the open/closed state of an object and the count of objects
// created from it. Close fails with ErrBusy while deps > 0, as
// ibv_dealloc_pd does with EBUSY; a closed object refuses every use with
// ErrClosed. dead is read without the lock on hot paths (post, poll).
type life struct {
	mu   sync.Mutex
	deps int
	dead atomic.Bool
}

// hold registers a dependent; it fails once the object is closed.
func (l *life) hold(what string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead.Load() {
		return fmt.Errorf("ibv: %s: %w", what, verbs.ErrClosed)
	}
	l.deps++
	return nil
}

func (l *life) release() {
	l.mu.Lock()
	l.deps--
	l.mu.Unlock()
}

// close runs destroy once no dependent is left.
func (l *life) close(what string, destroy func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead.Load() {
		return fmt.Errorf("ibv: close %s: %w", what, verbs.ErrClosed)
	}
	if l.deps > 0 {
		return fmt.Errorf("ibv: close %s: %w: %d objects created from it are open", what, verbs.ErrBusy, l.deps)
	}
	if err := destroy(); err != nil {
		return err
	}
	l.dead.Store(true)
	return nil
}

func (l *life) closed(what string) error {
	if l.dead.Load() {
		return fmt.Errorf("ibv: %s: %w", what, verbs.ErrClosed)
	}
	return nil
}

//go:build ibverbs && linux

package ibv

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// errnoOf returns the errno a libibverbs call left: the int it returned
// when it returns one, else errno from cgo's second result.
func errnoOf(rc int, err error) syscall.Errno {
	if rc > 0 {
		return syscall.Errno(rc)
	}
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return syscall.EIO
}

// wrap maps an errno to the verbs error class a caller tests for, keeping
// the errno in the chain. post says ENOMEM means a full work queue rather
// than a device limit.
func wrap(what string, e syscall.Errno, post bool) error {
	var class error
	switch e {
	case syscall.EINVAL, syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.ERANGE:
		class = verbs.ErrInvalid
	case syscall.ENOMEM, syscall.ENOSPC, syscall.EAGAIN:
		class = verbs.ErrNoResources
		if post {
			class = verbs.ErrQueueFull
		}
	case syscall.EBUSY:
		class = verbs.ErrBusy
	case syscall.EFAULT:
		class = verbs.ErrFault
	}
	if class == nil {
		return fmt.Errorf("ibv: %s: %w", what, e)
	}
	return fmt.Errorf("ibv: %s: %w (%w)", what, class, e)
}

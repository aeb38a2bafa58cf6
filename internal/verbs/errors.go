package verbs

import (
	"errors"
	"fmt"
)

// Errors returned by verbs calls (not completions). Providers wrap them with
// context; callers test with errors.Is.
var (
	// ErrInvalid is EINVAL: a bad argument, or an operation the QP's type
	// or state does not allow.
	ErrInvalid = errors.New("verbs: invalid argument")
	// ErrInvalidState is an ErrInvalid for a post or transition in the
	// wrong QP state.
	ErrInvalidState = fmt.Errorf("%w: wrong QP state", ErrInvalid)
	// ErrQueueFull is ENOMEM on post: the work queue has no free entry.
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrNoResources is ENOMEM on create: a device limit was reached.
	ErrNoResources = errors.New("verbs: out of device resources")
	// ErrBusy is EBUSY: the object still has dependents.
	ErrBusy = errors.New("verbs: resource busy")
	// ErrClosed is returned for any use of a closed object.
	ErrClosed = errors.New("verbs: closed")
	// ErrFault is EFAULT: memory to register is not mapped with the
	// access asked (PD.RegMRMem).
	ErrFault = errors.New("verbs: bad address")
)

// Classes of completion errors, matched by WCError.Is.
var (
	ErrFlushed       = errors.New("verbs: work request flushed")
	ErrRemoteAccess  = errors.New("verbs: remote access error")
	ErrRetryExceeded = errors.New("verbs: retry count exceeded")
	ErrRemote        = errors.New("verbs: remote error")
	ErrLocal         = errors.New("verbs: local error")
)

// WCError is a completion that did not succeed.
type WCError struct {
	Status WCStatus
	Opcode WCOpcode
	QPN    uint32
}

// Err returns nil for a successful completion, else a *WCError.
func (wc *WC) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, Opcode: wc.Opcode, QPN: wc.QPN}
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: %v completion on QP %#x: %v", e.Opcode, e.QPN, e.Status)
}

// Is maps the status to its class, so callers match errors.Is(err, ErrRemoteAccess).
func (e *WCError) Is(target error) bool {
	switch e.Status {
	case WCWRFlushErr:
		return target == ErrFlushed
	case WCRemAccessErr:
		return target == ErrRemoteAccess || target == ErrRemote
	case WCRetryExcErr, WCRNRRetryExcErr:
		return target == ErrRetryExceeded
	case WCRemInvReqErr, WCRemOpErr, WCRemAbortErr, WCRemInvRDReqErr:
		return target == ErrRemote
	case WCLocLenErr, WCLocQPOpErr, WCLocProtErr, WCLocAccessErr:
		return target == ErrLocal
	}
	return false
}

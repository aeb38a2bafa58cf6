package device

import (
	"errors"
	"strings"
)

// Reasons a device does not open, as the RDMANode's DeviceReady condition
// names them.
const (
	ReasonNotFound       = "DeviceNotFound"
	ReasonPortDown       = "PortDown"
	ReasonInvalidPort    = "InvalidPort"
	ReasonInvalidGID     = "InvalidGIDIndex"
	ReasonNotBuiltIn     = "ProviderNotBuiltIn"
	ReasonOpenFailed     = "DeviceOpenFailed"
	ReasonInvalidRequest = "InvalidProvider"
)

// OpenError is why Open failed: the provider's error and the reason a
// condition reports for it.
type OpenError struct {
	reason string
	Err    error
}

func (e *OpenError) Error() string { return e.Err.Error() }
func (e *OpenError) Unwrap() error { return e.Err }

// Reason is the class of the failure, one of the Reason constants. The
// RDMANode reporter reads it through this method (an interface), so that
// it needs no provider.
func (e *OpenError) Reason() string { return e.reason }

// Reason returns the reason of the OpenError in err's chain, or
// ReasonOpenFailed.
func Reason(err error) string {
	var oe *OpenError
	if errors.As(err, &oe) {
		return oe.reason
	}
	return ReasonOpenFailed
}

// classifyIBVerbs names the reason of an error of ibv.Open. ibv's errors
// carry no type for these cases (verbs.ErrInvalid covers a bad port and a
// bad GID index alike), so its messages are read; ibv's tests pin them.
func classifyIBVerbs(err error) error {
	msg := err.Error()
	reason := ReasonOpenFailed
	switch {
	case strings.Contains(msg, "no RDMA device matches"):
		reason = ReasonNotFound
	case strings.Contains(msg, "not ACTIVE"):
		reason = ReasonPortDown
	case strings.Contains(msg, "GID index"):
		reason = ReasonInvalidGID
	case strings.Contains(msg, "port"):
		reason = ReasonInvalidPort
	}
	return &OpenError{reason: reason, Err: err}
}

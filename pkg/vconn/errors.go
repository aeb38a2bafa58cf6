package vconn

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// Code classifies an Error.
type Code uint32

// Codes; the agent's are those of its protocol.
const (
	CodeBadRequest   = Code(frame.CodeBadRequest)
	CodeVersion      = Code(frame.CodeVersion)
	CodeQuota        = Code(frame.CodeQuota)
	CodeNoHandle     = Code(frame.CodeNoHandle)
	CodeRefused      = Code(frame.CodeRefused)
	CodeUnreachable  = Code(frame.CodeUnreachable)
	CodeClosed       = Code(frame.CodeClosed)
	CodeReset        = Code(frame.CodeReset)
	CodePeerGone     = Code(frame.CodePeerGone)
	CodeTooLarge     = Code(frame.CodeTooLarge)
	CodeInternal     = Code(frame.CodeInternal)
	CodeAddrInUse    = Code(frame.CodeAddrInUse)
	CodeRegion       = Code(frame.CodeRegion)
	CodeWindow       = Code(frame.CodeWindow)
	CodeShuttingDown = Code(frame.CodeShuttingDown)
	CodeLimit        = Code(frame.CodeLimit)
	CodeNoAddress    = Code(frame.CodeNoAddress)
	CodeUnknownHost  = Code(frame.CodeUnknownHost)
	// CodeAgentGone: the connection to the local agent broke.
	CodeAgentGone Code = 1000
	// CodeNotStream: Read or Write on a vconn whose transport (uc, ud)
	// may lose messages; SendMsg and RecvMsg work on it.
	CodeNotStream Code = 1001
	// CodeNoAgent: the agent's socket could not be connected to at all
	// (no socket, no permission, no agent listening).
	CodeNoAgent Code = 1002
)

func (c Code) String() string {
	switch c {
	case CodeAgentGone:
		return "agent connection lost"
	case CodeNotStream:
		return "not a byte stream"
	case CodeNoAgent:
		return "cannot connect to the agent"
	}
	return frame.Code(c).String()
}

// Error is a failure the agent reported, or the loss of the agent.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "vconn: " + e.Code.String()
	}
	return fmt.Sprintf("vconn: %s: %s", e.Code, e.Message)
}

// Is matches any *Error of the same code, so errors.Is(err, ErrQuota)
// works on what the agent sent.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	ErrQuota       error = &Error{Code: CodeQuota}
	ErrRefused     error = &Error{Code: CodeRefused}
	ErrUnreachable error = &Error{Code: CodeUnreachable}
	ErrClosed      error = &Error{Code: CodeClosed}
	ErrReset       error = &Error{Code: CodeReset}
	ErrPeerGone    error = &Error{Code: CodePeerGone}
	ErrTooLarge    error = &Error{Code: CodeTooLarge}
	ErrRegion      error = &Error{Code: CodeRegion}
	ErrAddrInUse   error = &Error{Code: CodeAddrInUse}
	// ErrLimit: a limit of the allocation (sessions, listeners, exported
	// regions or their bytes, bytes of sends queued in the agent), or the
	// node's registered memory for all regions, is reached; closing some
	// frees it (a region once its memory is deregistered: see
	// Region.Close). After a send refused for queued bytes, the vconn
	// sends no more.
	ErrLimit error = &Error{Code: CodeLimit}
	// ErrNoAddress: the allocation belongs to a pod the agent does not
	// know yet (the CNI plugin registers it, the device plugin names the
	// allocation's pod); Listen and Dial wait a while before they fail so.
	ErrNoAddress error = &Error{Code: CodeNoAddress}
	// ErrUnknownHost: a host name that neither the agent (node names) nor
	// the resolver (DNS) knows.
	ErrUnknownHost error = &Error{Code: CodeUnknownHost}
	ErrAgentGone   error = &Error{Code: CodeAgentGone}
	ErrNotStream   error = &Error{Code: CodeNotStream}
	// ErrNoAgent: the session never started : no socket, no permission to it, or no agent listening.
	ErrNoAgent error = &Error{Code: CodeNoAgent}
)

// noAgent says why the agent's socket at path refused a connection, and
// what the pod's author can do about it: the bare errno names neither the
// socket's group nor the pod's supplementalGroups.
func noAgent(path string, err error) error {
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		msg = fmt.Sprintf("permission denied on %s: a pod that does not run as root needs the RDMAService's spec.socketGroup among its securityContext.supplementalGroups", path)
	case errors.Is(err, syscall.ENOENT):
		msg = fmt.Sprintf("no agent socket at %s: does the pod request an RDMAvisor vconn resource (rdmavisor.io/vconn or a ResourceClaim), and is RDMAVISOR_SOCKET its path?", path)
	case errors.Is(err, syscall.ECONNREFUSED):
		msg = fmt.Sprintf("nothing listens on %s: the node's agent is not running or is restarting; retry", path)
	}
	return &Error{Code: CodeNoAgent, Message: msg}
}

func errOf(f *frame.Frame) error {
	if f.Op != frame.OpError {
		return nil
	}
	return &Error{Code: Code(f.Arg), Message: string(f.Payload)}
}

package agent

import (
	"errors"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func (s *session) write(f *frame.Frame) error { return s.w.Write(f) }

func (s *session) ok(req, h uint32) error {
	return s.write(&frame.Frame{Op: frame.OpOK, Req: req, Handle: h})
}

// reply answers a request with an error; every error reply goes through
// it, so it counts the pod's refusals.
func (s *session) reply(req, h uint32, c frame.Code, msg string) error {
	if r, ok := refusalOf(c); ok {
		s.al.stats.refused(r)
	}
	return s.write(&frame.Frame{Op: frame.OpError, Req: req, Handle: h, Arg: uint32(c), Payload: []byte(msg)})
}

func (s *session) replyErr(req, h uint32, err error) error {
	return s.reply(req, h, codeOf(err), err.Error())
}

// codeOf classifies an error for the application: the one place where
// the engine's, the devices' and the control plane's failure classes
// (statusError) become the application protocol's codes.
func codeOf(err error) frame.Code {
	switch {
	case errors.Is(err, engine.ErrPeerGone), errors.Is(err, engine.ErrQPFailed):
		return frame.CodePeerGone
	case errors.Is(err, engine.ErrReset), errors.Is(err, engine.ErrLost):
		return frame.CodeReset
	case errors.Is(err, engine.ErrClosed), errors.Is(err, engine.ErrNotOpen):
		return frame.CodeClosed
	case errors.Is(err, engine.ErrEngineClosed):
		return frame.CodeShuttingDown
	case errors.Is(err, engine.ErrTooLarge):
		return frame.CodeTooLarge
	case errors.Is(err, engine.ErrNoRegion), errors.Is(err, engine.ErrRegionAccess), errors.Is(err, verbs.ErrRemoteAccess):
		return frame.CodeRegion
	case errors.Is(err, verbs.ErrInvalid):
		return frame.CodeBadRequest
	case errors.Is(err, errRefused), errors.Is(err, errPolicy):
		return frame.CodeRefused
	case errors.Is(err, errPeerQuota):
		return frame.CodeQuota
	case errors.Is(err, errUnreachable), errors.Is(err, errBadReply):
		return frame.CodeUnreachable
	case errors.Is(err, errPeerInvalid):
		return frame.CodeBadRequest
	case errors.Is(err, errUnreliable):
		return frame.CodeBadRequest
	case errors.Is(err, errWindow):
		return frame.CodeWindow
	case errors.Is(err, errLimit), errors.Is(err, engine.ErrRegisteredLimit):
		return frame.CodeLimit
	case errors.Is(err, errNoAddress):
		return frame.CodeNoAddress
	case errors.Is(err, errUnknownHost):
		return frame.CodeUnknownHost
	}
	return frame.CodeInternal
}

//go:build !linux

package agent

import (
	"errors"
	"net"
)

type ucred struct{ Pid, Uid, Gid int32 }

func peerCred(*net.UnixConn) (*ucred, error) {
	return nil, errors.New("agent: SO_PEERCRED needs Linux")
}

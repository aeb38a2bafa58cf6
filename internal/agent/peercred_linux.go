package agent

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// peerCred returns the credentials of a unix socket's peer (SO_PEERCRED).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("agent: SO_PEERCRED: %w", serr)
	}
	return cred, nil
}

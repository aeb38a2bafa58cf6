package shm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// RightsSpace is the out-of-band buffer a receiver needs for a Segment's
// descriptors.
var RightsSpace = unix.CmsgSpace(3 * 4)

// Rights encodes fds as an SCM_RIGHTS control message.
func Rights(fds []int) []byte { return unix.UnixRights(fds...) }

// ParseRights returns every descriptor in the control messages of oob.
// The caller owns them, and must close them even on error.
func ParseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("shm: control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // not SCM_RIGHTS
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// CloseFDs closes descriptors received or made to pass, ignoring errors:
// what is left of them after a send or a failure.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

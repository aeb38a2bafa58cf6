package vconn

import (
	"context"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// OnSharedMemory reports whether the vconn's messages travel in shared
// memory.
func (c *Conn) OnSharedMemory() bool { return c.shm != nil }

// SharedMemory is the vconn's mapping (nil on the socket), for tests that
// play a hostile pod.
func (c *Conn) SharedMemory() []byte {
	if c.shm == nil {
		return nil
	}
	return c.shm.seg.Bytes()
}

// AskSharedMemory asks the agent for shared memory again.
func (c *Conn) AskSharedMemory(ctx context.Context) error {
	_, fds, err := c.s.callRights(ctx, &frame.Frame{Op: frame.OpShm, Handle: c.h})
	shm.CloseFDs(fds)
	return err
}

// PushRaw puts a descriptor with any flags in the TX ring.
func (c *Conn) PushRaw(b []byte, imm, flags uint32) (bool, error) {
	c.shm.tmu.Lock()
	defer c.shm.tmu.Unlock()
	return c.shm.tx.Push(b, imm, flags)
}

// WriteFrame writes f as it is on the session of c: for tests that make
// the agent answer what no method of the package sends.
func (c *Conn) WriteFrame(f frame.Frame) error { return c.s.write(&f) }

// SplitAddr is splitAddr, for the fuzz target.
func SplitAddr(addr string) (string, uint16, error) { return splitAddr(addr) }

// NoAgent is noAgent, for the errno a dial would have seen.
var NoAgent = noAgent

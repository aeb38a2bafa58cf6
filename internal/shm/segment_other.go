//go:build !linux

package shm

import (
	"errors"
	"fmt"
	"time"
)

// Bell is a doorbell; only Linux has them.
type Bell struct{}

// Ring does nothing here.
func (*Bell) Ring() {}

// Wait fails here.
func (*Bell) Wait(time.Duration) (bool, error) { return false, errors.ErrUnsupported }

// Segment is one vconn's shared memory; only Linux has them.
type Segment struct{ Layout Layout }

// RightsSpace is 0: no descriptors pass here.
var RightsSpace = 0

var errNoShm = fmt.Errorf("shm: shared memory path: %w", errors.ErrUnsupported)

// Create fails: the shared-memory path needs Linux memfds.
func Create(string, Layout) (*Segment, error) { return nil, errNoShm }

// Open fails, as Create.
func Open(Layout, []int) (*Segment, error) { return nil, errNoShm }

// NewMemfd fails: memfds are Linux's.
func NewMemfd(string, int) (int, []byte, error) { return -1, nil, errNoShm }

// MapMemfd fails, as NewMemfd.
func MapMemfd(int, int) ([]byte, error) { return nil, errNoShm }

// Unmap does nothing here.
func Unmap([]byte) error { return nil }

// Rights is empty here.
func Rights([]int) []byte { return nil }

// CloseFDs has nothing to close here.
func CloseFDs([]int) {}

// ParseRights finds nothing here.
func ParseRights([]byte) ([]int, error) { return nil, nil }

func (*Segment) Files() []int                  { return nil }
func (*Segment) ClosePeer()                    {}
func (*Segment) Agent() (*Consumer, *Producer) { return nil, nil }
func (*Segment) Pod() (*Producer, *Consumer)   { return nil, nil }
func (*Segment) Shutdown()                     {}
func (*Segment) Close() error                  { return nil }

// Shutdown does nothing here.
func (*Bell) Shutdown() {}

// Close does nothing here.
func (*Bell) Close() error { return nil }

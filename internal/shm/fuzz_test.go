package shm

import (
	"testing"
	"unsafe"
)

// FuzzConsumer fills the ring's header and descriptors with the fuzzer's
// bytes (what a hostile pod can write) and drains it: Peek must never
// panic, and every payload it returns must lie inside the slab.
func FuzzConsumer(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, headerLen+int(small.Entries)*DescLen))
	seed := make([]byte, headerLen+int(small.Entries)*DescLen)
	seed[offTail] = 3
	seed[headerLen+4] = 10                // desc 0: 10 bytes at 0
	seed[headerLen+DescLen] = 64          // desc 1: at 64
	seed[headerLen+DescLen+4] = 0xff      // ... 255 bytes
	seed[headerLen+2*DescLen+1] = 0x04    // desc 2: at 1024: past the slab
	seed[headerLen+2*DescLen+12] = 1 << 1 // EOF
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		mem, _, c := heapRing(t, small)
		copy(mem[:headerLen+int(small.Entries)*DescLen], b)
		slab := c.r.slab
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(slab)))
		for i := 0; i <= int(small.Entries)+1; i++ {
			d, p, ok, err := c.Peek()
			if err != nil || !ok {
				return
			}
			if int(d.Len) != len(p) || d.Len > small.MaxMessage {
				t.Fatalf("descriptor %+v, payload %d bytes", d, len(p))
			}
			if len(p) > 0 {
				at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
				if at < lo || at+uintptr(len(p)) > lo+uintptr(len(slab)) || cap(p) != len(p) {
					t.Fatalf("payload of %d bytes at slab+%d outside %d", len(p), at-lo, len(slab))
				}
			}
			c.Release()
		}
	})
}

// FuzzLayout: decoding never panics and accepts only valid layouts.
func FuzzLayout(f *testing.F) {
	f.Add(AppendLayout(nil, DefaultLayout))
	f.Add(AppendLayout(nil, Layout{Entries: 3}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := DecodeLayout(b)
		if err != nil {
			return
		}
		if l.Validate() != nil || string(AppendLayout(nil, l)) != string(b) {
			t.Fatalf("accepted %+v from %x", l, b)
		}
		if l.Size() <= 0 || l.Size()%pageSize != 0 {
			t.Fatalf("size %d", l.Size())
		}
	})
}

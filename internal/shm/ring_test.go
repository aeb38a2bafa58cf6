package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"unsafe"
)

var small = Layout{Entries: 8, Slab: 1024, MaxMessage: 256}

// heapRing is a ring over Go memory, so the race detector sees the
// accesses of both ends (it does not track mmap'd memory).
func heapRing(t testing.TB, l Layout) ([]byte, *Producer, *Consumer) {
	t.Helper()
	words := make([]uint64, l.ringLen()/8) // 8-byte aligned
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), l.ringLen())
	r := newRing(mem, l)
	return mem, newProducer(r, nil), newConsumer(r, nil)
}

func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		l  Layout
		ok bool
	}{
		{DefaultLayout, true},
		{small, true},
		{Layout{Entries: 3, Slab: 1024, MaxMessage: 256}, false},
		{Layout{Entries: 1 << 17, Slab: 1024, MaxMessage: 256}, false},
		{Layout{Entries: 8, Slab: 1000, MaxMessage: 256}, false},
		{Layout{Entries: 8, Slab: 1024, MaxMessage: 513}, false},
		{Layout{Entries: 8, Slab: 1024}, false},
	} {
		t.Run(fmt.Sprintf("%+v", tc.l), func(t *testing.T) {
			got, err := DecodeLayout(AppendLayout(nil, tc.l))
			if (err == nil) != tc.ok {
				t.Fatalf("decode: %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && got != tc.l {
				t.Fatalf("round trip: %+v", got)
			}
			if !tc.ok && !errors.Is(err, ErrLayout) {
				t.Fatalf("error %v is not ErrLayout", err)
			}
		})
	}
	if l := DefaultLayout; l.Size()%pageSize != 0 || l.Size() < 2*int(l.Slab) {
		t.Errorf("default layout size %d", l.Size())
	}
}

// TestRingFIFO pushes messages of every size through a ring between two
// goroutines and checks each arrives whole, once, in order.
func TestRingFIFO(t *testing.T) {
	_, p, c := heapRing(t, small)
	const n = 20000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, small.MaxMessage)
		for i := 0; i < n; {
			m := buf[:i%int(small.MaxMessage+1)]
			for j := range m {
				m[j] = byte(i + j)
			}
			ok, err := p.Push(m, uint32(i), FlagImm)
			if err != nil {
				t.Error(err)
				return
			}
			if ok {
				i++
			} else {
				runtime.Gosched()
			}
		}
	}()
	for i := 0; i < n; {
		d, b, ok, err := c.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			runtime.Gosched()
			continue
		}
		if d.Imm != uint32(i) || d.Flags != FlagImm || len(b) != i%int(small.MaxMessage+1) {
			t.Fatalf("message %d: %+v, %d bytes", i, d, len(b))
		}
		for j := range b {
			if b[j] != byte(i+j) {
				t.Fatalf("message %d byte %d: %d", i, j, b[j])
			}
		}
		c.Release()
		i++
	}
	wg.Wait()
	if !p.Empty() {
		t.Error("producer does not see the ring empty")
	}
}

// TestRingRoom checks both limits: descriptors and slab bytes.
func TestRingRoom(t *testing.T) {
	_, p, c := heapRing(t, small)
	big := make([]byte, small.MaxMessage) // 4 fill the 1 KiB slab
	for i := 0; i < 4; i++ {
		if ok, err := p.Push(big, 0, 0); !ok || err != nil {
			t.Fatalf("push %d: %v %v", i, ok, err)
		}
	}
	if ok, _ := p.Push([]byte{1}, 0, 0); ok {
		t.Fatal("pushed into a full slab")
	}
	if _, _, ok, _ := c.Peek(); !ok {
		t.Fatal("nothing to peek")
	}
	c.Release()
	if ok, _ := p.Push(big, 0, 0); !ok {
		t.Fatal("no room after a release")
	}
	for i := 0; i < 4; i++ {
		c.Peek()
		c.Release()
	}
	// Descriptors: 8 empty messages fill the ring.
	for i := 0; i < 8; i++ {
		if ok, err := p.Push(nil, 0, 0); !ok || err != nil {
			t.Fatalf("empty push %d: %v %v", i, ok, err)
		}
	}
	if ok, _ := p.Push(nil, 0, 0); ok {
		t.Fatal("pushed a 9th descriptor into 8")
	}
	if _, err := p.Push(make([]byte, small.MaxMessage+1), 0, 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized push: %v", err)
	}
}

// TestRingCorrupt scribbles what the other side writes and checks each
// end reports ErrCorrupt instead of using it.
func TestRingCorrupt(t *testing.T) {
	put := func(mem []byte, off int, v uint32) { binary.LittleEndian.PutUint32(mem[off:], v) }
	for _, tc := range []struct {
		name      string
		scribble  func(mem []byte)
		producer  bool // the producer's check fails, not the consumer's
		untouched bool // no error expected
	}{
		{name: "tail beyond the ring", scribble: func(m []byte) { put(m, offTail, 100) }},
		{name: "tail behind head", scribble: func(m []byte) { put(m, offTail, 0xffffffff) }},
		{name: "offset outside the slab", scribble: func(m []byte) { put(m, headerLen, 4096) }},
		{name: "length past the slab", scribble: func(m []byte) { put(m, headerLen, 1000); put(m, headerLen+4, 100) }},
		{name: "length over max", scribble: func(m []byte) { put(m, headerLen, 0); put(m, headerLen+4, 300) }},
		{name: "offset+length wraps", scribble: func(m []byte) { put(m, headerLen, 0xffffff00); put(m, headerLen+4, 0x200) }},
		{name: "unknown flags", scribble: func(m []byte) { put(m, headerLen+12, 1<<9) }},
		{name: "head past tail", scribble: func(m []byte) { put(m, offHead, 5) }, producer: true},
		{name: "head backwards", scribble: func(m []byte) { put(m, offHead, 0xfffffff0) }, producer: true},
		{name: "immediate is free", scribble: func(m []byte) { put(m, headerLen+8, 0xdeadbeef) }, untouched: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, p, c := heapRing(t, small)
			if ok, err := p.Push([]byte("hello"), 0, 0); !ok || err != nil {
				t.Fatal(ok, err)
			}
			tc.scribble(mem)
			var err error
			if tc.producer {
				_, err = p.Push([]byte("x"), 0, 0)
			} else {
				_, _, _, err = c.Peek()
			}
			if tc.untouched {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestRingAllocs asserts the hot path allocates nothing.
func TestRingAllocs(t *testing.T) {
	_, p, c := heapRing(t, small)
	msg := make([]byte, 64)
	n := testing.AllocsPerRun(1000, func() {
		if ok, err := p.Push(msg, 1, FlagImm); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, b, ok, err := c.Peek(); !ok || err != nil || !bytes.Equal(b, msg) {
			t.Fatal(ok, err)
		}
		c.Release()
	})
	if n != 0 {
		t.Errorf("%v allocations per push/peek/release", n)
	}
}

func BenchmarkRing(b *testing.B) {
	_, p, c := heapRing(b, DefaultLayout)
	msg := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		p.Push(msg, 0, 0)
		c.Peek()
		c.Release()
	}
}

// TestHoldRelease: a consumer that holds descriptors reads past them
// while their bytes stay the producer's to keep (no room reused), and a
// Release on another goroutine gives back the oldest first; Peek without
// Hold then Release still takes one message, as before. Under -race the
// two goroutines' accesses are checked.
func TestHoldRelease(t *testing.T) {
	_, p, c := heapRing(t, small) // 8 entries, 1 KiB of slab, 256-byte messages
	msg := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 200) }
	for i := range 4 { // 4 × 256 bytes of slab: full
		if ok, err := p.Push(msg(i), uint32(i), 0); !ok || err != nil {
			t.Fatalf("push %d: %v %v", i, ok, err)
		}
	}
	var held []uint32
	for i := range 3 {
		d, b, ok, err := c.Peek()
		if !ok || err != nil || d.Imm != uint32(i) || !bytes.Equal(b, msg(i)) {
			t.Fatalf("peek %d: %+v %v %v", i, d, ok, err)
		}
		held = append(held, c.Hold())
	}
	if held[0] != 0 || held[2] != 2 {
		t.Fatalf("held indexes %v, want 0 1 2", held)
	}
	if ok, _ := p.Push(msg(9), 9, 0); ok {
		t.Fatal("a push found room while every byte of the slab was held or unread")
	}
	done := make(chan struct{})
	go func() { // the engine's poller, giving back what it sent
		defer close(done)
		c.Release()
	}()
	<-done
	// One released: the oldest (message 0), so 256 bytes are free again.
	if ok, err := p.Push(msg(4), 4, 0); !ok || err != nil {
		t.Fatalf("push after a release: %v %v", ok, err)
	}
	if ok, _ := p.Push(msg(5), 5, 0); ok {
		t.Fatal("a second push found room: more than the oldest was released")
	}
	// Peek goes on after the held ones: message 3, then 4.
	for _, want := range []uint32{3, 4} {
		d, _, ok, err := c.Peek()
		if !ok || err != nil || d.Imm != want {
			t.Fatalf("peek after holds: %+v %v %v, want message %d", d, ok, err, want)
		}
		c.Hold()
	}
	if _, _, ok, _ := c.Peek(); ok {
		t.Fatal("peek past the last message found one")
	}
	for range 4 {
		c.Release()
	}
	if !p.Empty() {
		t.Fatal("every held descriptor released, the producer's ring is not empty")
	}
	// Without Hold, Peek and Release take one message each, as before.
	for i := range 2 {
		if ok, err := p.Push(msg(i), uint32(10+i), 0); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	for i := range 2 {
		d, _, ok, err := c.Peek()
		if !ok || err != nil || d.Imm != uint32(10+i) {
			t.Fatalf("peek %d without hold: %+v %v %v", i, d, ok, err)
		}
		c.Release()
	}
	c.Release() // nothing peeked: nothing happens
	if !p.Empty() {
		t.Fatal("ring not empty after the unheld messages")
	}
}

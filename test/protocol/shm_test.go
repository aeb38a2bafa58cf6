package protocol

import (
	"encoding/binary"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// The shared-memory segment as docs/protocol.md §5 writes it down: this
// file reads and writes the rings from the document, not with package
// shm, so that the agent is held to what the document says.

// Descriptor flags (§5, The segment).
const (
	descImm   = 1
	descEOF   = 2
	descError = 4
)

// layout is Shm's OK payload.
type layout struct{ entries, slab, maxMessage uint32 }

func decodeLayout(t *testing.T, p []byte) layout {
	t.Helper()
	if len(p) != 12 {
		t.Fatalf("R5.1: a Layout of %d bytes, want 12", len(p))
	}
	l := layout{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), binary.BigEndian.Uint32(p[8:])}
	switch {
	case l.entries < 2 || l.entries > 65536 || l.entries&(l.entries-1) != 0:
		t.Fatalf("R5.1: entries %d: want a power of two, 2..65536", l.entries)
	case l.slab < 64 || l.slab > 1<<28 || l.slab%64 != 0:
		t.Fatalf("R5.1: slab %d: want a multiple of 64, 64..2^28", l.slab)
	case l.maxMessage < 1 || l.maxMessage > l.slab/2:
		t.Fatalf("R5.1: max message %d: want 1..slab/2", l.maxMessage)
	}
	return l
}

// ringLen is a ring's area rounded up to 4,096 bytes.
func (l layout) ringLen() int { return (256 + int(l.entries)*16 + int(l.slab) + 4095) &^ 4095 }

// ring is one ring of a mapped segment.
type ring struct {
	mem  []byte // the ring's area
	l    layout
	bell *os.File // its doorbell
	// next is where this side puts its next payload (producer) and the
	// head it has taken to (consumer).
	next uint32
}

func (r *ring) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }
func (r *ring) tail() *uint32        { return r.word(0) }
func (r *ring) head() *uint32        { return r.word(64) }
func (r *ring) sleeping() *uint32    { return r.word(128) }
func (r *ring) waiting() *uint32     { return r.word(192) }
func (r *ring) slab() []byte {
	return r.mem[256+int(r.l.entries)*16 : 256+int(r.l.entries)*16+int(r.l.slab)]
}

// desc is a descriptor: off, len, imm, flags.
type desc struct{ off, n, imm, flags uint32 }

func (r *ring) desc(i uint32) desc {
	b := r.mem[256+int(i%r.l.entries)*16:]
	return desc{binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])}
}

func (r *ring) setDesc(i uint32, d desc) {
	b := r.mem[256+int(i%r.l.entries)*16:]
	binary.LittleEndian.PutUint32(b, d.off)
	binary.LittleEndian.PutUint32(b[4:], d.n)
	binary.LittleEndian.PutUint32(b[8:], d.imm)
	binary.LittleEndian.PutUint32(b[12:], d.flags)
}

func ringBell(f *os.File) { _, _ = unix.Write(int(f.Fd()), []byte{1}) }

// publish produces one message (the client's side of ring TX): whole
// 64-byte lines, never wrapping.
func (r *ring) publish(t *testing.T, p []byte, imm, flags uint32) {
	t.Helper()
	tail := atomic.LoadUint32(r.tail())
	if tail-atomic.LoadUint32(r.head()) == r.l.entries {
		t.Fatal("ring TX full")
	}
	lines := (uint32(len(p)) + 63) &^ 63
	if r.next+lines > r.l.slab {
		r.next = 0
	}
	copy(r.slab()[r.next:], p)
	r.setDesc(tail, desc{r.next, uint32(len(p)), imm, flags})
	r.next += lines
	atomic.StoreUint32(r.tail(), tail+1)
	if atomic.SwapUint32(r.sleeping(), 0) != 0 {
		ringBell(r.bell)
	}
}

// take consumes one descriptor of ring RX within 10 s, checking it as a
// consumer must: its flags, its length, its place in the slab.
func (r *ring) take(t *testing.T) (desc, []byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadUint32(r.tail()) == r.next {
		if time.Now().After(deadline) {
			t.Fatal("ring RX: no descriptor within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tail := atomic.LoadUint32(r.tail())
	if tail-r.next > r.l.entries {
		t.Fatalf("ring RX corrupt: tail %d, head %d", tail, r.next)
	}
	d := r.desc(r.next)
	if d.flags&^(descImm|descEOF|descError) != 0 || d.n > r.l.maxMessage || d.off > r.l.slab || d.n > r.l.slab-d.off {
		t.Fatalf("ring RX: a descriptor out of the rules: %+v", d)
	}
	p := append([]byte(nil), r.slab()[d.off:d.off+d.n]...)
	r.next++
	atomic.StoreUint32(r.head(), r.next)
	if atomic.SwapUint32(r.waiting(), 0) != 0 {
		ringBell(r.bell)
	}
	return d, p
}

// segment is a vconn's mapped shared memory.
type segment struct {
	l      layout
	mem    []byte
	memfd  *os.File
	tx, rx *ring
}

// openShm asks for shared memory for vconn h of s and maps it, checking
// the OK as R5.1 says.
func openShm(t *testing.T, s *sess, h uint32) *segment {
	t.Helper()
	req := s.next()
	s.send(frame.Frame{Op: frame.OpShm, Req: req, Handle: h})
	m := s.recvFDs(3)
	if m.Op != frame.OpOK || m.Req != req || m.Handle != h {
		t.Fatalf("R5.1: Shm: %v", m)
	}
	l := decodeLayout(t, m.Payload)
	var st unix.Stat_t
	if err := unix.Fstat(int(m.fds[0].Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Fatalf("R5.1: the first descriptor is no memfd: %v (mode %o)", err, st.Mode)
	}
	if st.Size < int64(2*l.ringLen()) {
		t.Fatalf("R5.3: memfd of %d bytes, the segment is %d", st.Size, 2*l.ringLen())
	}
	mem, err := unix.Mmap(int(m.fds[0].Fd()), 0, 2*l.ringLen(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("map the segment: %v", err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	for _, f := range m.fds[1:] {
		if typ, err := unix.GetsockoptInt(int(f.Fd()), unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
			t.Fatalf("R5.3: a doorbell is no stream socket: %d, %v", typ, err)
		}
	}
	return &segment{l: l, mem: mem, memfd: m.fds[0],
		tx: &ring{mem: mem[:l.ringLen()], l: l, bell: m.fds[1]},
		rx: &ring{mem: mem[l.ringLen():], l: l, bell: m.fds[2]}}
}

// readable: f has input (or its end) within d.
func readable(f *os.File, d time.Duration) bool {
	p := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLIN}}
	n, err := unix.Poll(p, int(d/time.Millisecond))
	return err == nil && n > 0
}

// atEOF: the other end of f closed (after draining what is there).
func atEOF(f *os.File) bool {
	fd := int(f.Fd()) // Fd makes f blocking: not the reads below
	_ = unix.SetNonblock(fd, true)
	b := make([]byte, 64)
	for {
		n, err := unix.Read(fd, b)
		switch {
		case err != nil:
			return false // EAGAIN: drained, still open
		case n == 0:
			return true
		}
	}
}

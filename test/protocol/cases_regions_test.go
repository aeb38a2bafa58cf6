package protocol

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// §3 Requests and replies, continued: Close, exported regions and staging
// memory.
var requestCases3 = []conformanceCase{
	{"R3.23", "Close of a vconn: OK, the peer's EOF after what was taken, the quota slot freed", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 4})
		p.A.sendMsg(p.ha, []byte("last"))
		if n := inUse(e.a, p.A.sock); n != 1 {
			t.Fatalf("%d vconns in use, want 1", n)
		}
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		if m := p.B.data(p.hb); string(m.Payload) != "last" {
			t.Fatalf("got %q", m.Payload)
		}
		if m := p.B.recv(); m.Op != frame.OpEOF {
			t.Fatalf("got %v, want EOF", m)
		}
		poll.Until(t, 10*time.Second, "the slot freed", func() bool { return inUse(e.a, p.A.sock) == 0 })
		p.A.fails(frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte("x")}, frame.CodeNoHandle)
	}},
	{"R3.24", "Close of a listener: OK, and a Dial of its port is refused", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.call(frame.Frame{Op: frame.OpClose, Handle: p.l})
		p.A.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(p.addr)}, frame.CodeRefused)
		p.A.sendMsg(p.ha, []byte("the vconns accepted stay"))
	}},
	{"R3.25", "Export: 1 byte to maxMessageBytes, access 1, 2 or 3; region ids count from 1 on each vconn", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for i, x := range []struct {
			access uint32
			size   uint64
		}{{1, 1}, {2, 4096}, {3, 1 << 20}} {
			if m := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: x.access, Arg2: x.size}); m.Arg != uint32(i+1) {
				t.Fatalf("export %d: region %d, want %d", i, m.Arg, i+1)
			}
		}
		if m := p.B.call(frame.Frame{Op: frame.OpExport, Handle: p.hb, Arg: 3, Arg2: 64}); m.Arg != 1 {
			t.Fatalf("the peer's first region: %d, want 1", m.Arg)
		}
	}},
	{"R3.26", "an export reaches the peer before any message sent after its OK", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 32})
		for range limitRegions {
			r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 1, Arg2: 64}).Arg
			p.A.sendMsg(p.ha, []byte{byte(r)})
			m := p.B.data(p.hb)
			p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: uint32(m.Payload[0]), Payload: length(8)})
		}
	}},
	{"R3.27", "LocalRead and LocalWrite copy this side's region; Read and Write the peer's, as its access allows", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a, b := p.A, p.B
		ro := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 1, Arg2: 64}).Arg
		wo := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 2, Arg2: 64}).Arg
		rw := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}).Arg
		a.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: ro, Arg2: 8, Payload: []byte("ro")})
		a.sendMsg(p.ha, []byte("exported")) // the exports reached B before it
		b.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		b.data(p.hb)
		if m := b.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: ro, Arg2: 8, Payload: length(2)}); string(m.Payload) != "ro" {
			t.Fatalf("Read of a readable region: %q", m.Payload)
		}
		b.fails(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: ro, Payload: []byte("no")}, frame.CodeRegion)
		b.call(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: wo, Arg2: 4, Payload: []byte("wo")})
		b.fails(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: wo, Payload: length(2)}, frame.CodeRegion)
		if m := a.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: wo, Arg2: 4, Payload: length(2)}); string(m.Payload) != "wo" {
			t.Fatalf("LocalRead of what the peer wrote: %q", m.Payload)
		}
		b.call(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: rw, Payload: []byte("rw")})
		if m := b.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: rw, Payload: length(2)}); string(m.Payload) != "rw" {
			t.Fatalf("Read of a region both ways: %q", m.Payload)
		}
	}},
	{"R3.28", "Unexport: OK, and the id names nothing, on this side and then on the peer's", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}).Arg
		p.A.sendMsg(p.ha, nil)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.data(p.hb)
		p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Payload: length(1)})
		p.A.call(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r})
		p.A.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: length(1)}, frame.CodeRegion)
		p.A.fails(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r}, frame.CodeRegion)
		poll.Until(t, 10*time.Second, "the peer's Read refused", func() bool {
			req := p.B.next()
			p.B.send(frame.Frame{Op: frame.OpRead, Req: req, Handle: p.hb, Arg: r, Payload: length(1)})
			m := p.B.recv()
			if m.Op == frame.OpError && frame.Code(m.Arg) != frame.CodeRegion {
				t.Fatalf("a Read of a withdrawn region: %v, want CodeRegion", m)
			}
			return m.Op == frame.OpError
		})
	}},
	{"R3.29", "Export with FlagMemfd: the OK carries a sealed memfd of the region's size, and its bytes are the region's, both ways", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		const size = 10000
		req := p.A.next()
		p.A.send(frame.Frame{Op: frame.OpExport, Req: req, Handle: p.ha, Flags: frame.FlagMemfd, Arg: 3, Arg2: size})
		m := p.A.recvFDs(1)
		if m.Op != frame.OpOK || m.Req != req || m.Handle != p.ha || m.Arg != 1 {
			t.Fatalf("Export with FlagMemfd: %v, want OK naming region 1", m)
		}
		r, fd := m.Arg, int(m.fds[0].Fd())
		seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
		const want = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if err != nil || seals&want != want {
			t.Fatalf("the memfd's seals: %#x, %v; want %#x", seals, err, want)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Size < size {
			t.Fatalf("the memfd: %d bytes, %v; want at least %d", st.Size, err, size)
		}
		// What a pod could do to the agent's mapping, refused.
		for _, n := range []int64{0, 4096, st.Size + 1} {
			if err := unix.Ftruncate(fd, n); err == nil {
				t.Fatalf("the pod resized the memfd to %d bytes", n)
			}
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err == nil {
			t.Fatal("the pod sealed the memfd against writes")
		}
		mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		copy(mem[9000:], "from the pod's mapping")
		if m := p.A.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Arg2: 9000, Payload: length(22)}); string(m.Payload) != "from the pod's mapping" {
			t.Fatalf("LocalRead of what the pod wrote in its mapping: %q", m.Payload)
		}
		p.A.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: r, Arg2: 200, Payload: []byte("local")})
		if string(mem[200:205]) != "local" {
			t.Fatalf("the mapping after a LocalWrite: %q", mem[200:205])
		}
		p.A.sendMsg(p.ha, nil) // the export reached B before it
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.data(p.hb)
		if m := p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Arg2: 9000, Payload: length(22)}); string(m.Payload) != "from the pod's mapping" {
			t.Fatalf("the peer's Read of what the pod wrote in its mapping: %q", m.Payload)
		}
		p.B.call(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: r, Arg2: 100, Payload: []byte("from the peer")})
		if string(mem[100:113]) != "from the peer" {
			t.Fatalf("the mapping after the peer's Write: %q", mem[100:113])
		}
		// A hole the pod punches is zeros to both sides, not a fault.
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != nil {
			t.Fatal(err)
		}
		if m := p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Arg2: 100, Payload: length(13)}); string(m.Payload) != string(make([]byte, 13)) {
			t.Fatalf("the peer's Read of a hole: %q", m.Payload)
		}
		p.A.call(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r})
		p.A.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: length(1)}, frame.CodeRegion)
		copy(mem, "still the pod's") // its own memory now
	}},
	{"R3.30", "Stage: a sealed memfd of the size asked, at most maxMessageBytes, not counted as a region", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		st := stage(t, p.A, p.ha, 1<<30)
		if st.size != 1<<20 {
			t.Fatalf("Stage of 1 GiB gave %d bytes, want maxMessageBytes (1 MiB)", st.size)
		}
		seals, err := unix.FcntlInt(uintptr(st.fd), unix.F_GET_SEALS, 0)
		const want = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if err != nil || seals&want != want {
			t.Fatalf("the memfd's seals: %#x, %v; want %#x", seals, err, want)
		}
		if err := unix.Ftruncate(st.fd, 0); err == nil {
			t.Fatal("the pod truncated the staging memfd")
		}
		q := stage(t, p.B, p.hb, 100)
		if q.size != 100 {
			t.Fatalf("Stage of 100 bytes gave %d", q.size)
		}
		// Not a region: limits.regions (4 here) still has room for 4.
		for range limitRegions {
			p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64})
		}
	}},
	{"R3.31", "Write and Read with FlagMemfd: the bytes of a span of staging memory, placed, and landed, any length that fits", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		const size = 300_000
		r := p.B.call(frame.Frame{Op: frame.OpExport, Handle: p.hb, Arg: 3, Arg2: size}).Arg
		p.B.sendMsg(p.hb, nil) // the export reached A before it
		p.A.send(frame.Frame{Op: frame.OpGrant, Handle: p.ha, Arg: 1})
		p.A.data(p.ha)
		st := stage(t, p.A, p.ha, 256<<10)
		mem := st.mmap(t)
		for i := range mem {
			mem[i] = byte(i * 13)
		}
		const n = 200_000
		p.A.call(frame.Frame{Op: frame.OpWrite, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Arg2: 1000, Payload: frame.AppendStaged(nil, 7, n)})
		for off := 0; off < n; off += frame.MaxPayload {
			k := min(frame.MaxPayload, n-off)
			m := p.B.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.hb, Arg: r, Arg2: uint64(1000 + off), Payload: length(uint32(k))})
			if !bytes.Equal(m.Payload, mem[7+off:7+off+k]) {
				t.Fatalf("the region at %d after the staged Write: other bytes than the span's", 1000+off)
			}
		}
		p.B.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.hb, Arg: r, Arg2: size - 5, Payload: []byte("tail!")})
		m := p.A.call(frame.Frame{Op: frame.OpRead, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Arg2: size - n, Payload: frame.AppendStaged(nil, 50_000, n)})
		if len(m.Payload) != 0 {
			t.Fatalf("a staged Read's OK carries %d bytes", len(m.Payload))
		}
		if got := string(mem[50_000+n-5 : 50_000+n]); got != "tail!" {
			t.Fatalf("staging memory after the staged Read ends with %q", got)
		}
		for j := range 1000 { // region[size-n+j] came from staging[7+size-n-1000+j] before the Read
			if want := byte((7 + size - n - 1000 + j) * 13); mem[50_000+j] != want {
				t.Fatalf("staging memory after the staged Read, byte %d: %#x, want %#x (what the staged Write placed)", j, mem[50_000+j], want)
			}
		}
		p.A.call(frame.Frame{Op: frame.OpWrite, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Payload: frame.AppendStaged(nil, 0, 0)})
		p.A.fails(frame.Frame{Op: frame.OpRead, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Arg2: size - 1, Payload: frame.AppendStaged(nil, 0, 2)}, frame.CodeRegion)
	}},
}

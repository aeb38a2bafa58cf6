package frame

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
)

// socketPair is the two ends of a pod protocol socket.
func socketPair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err = net.DialUnix("unixpacket", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	b, err = ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	return a, b
}

// A Writer writes each frame as one datagram, refuses one too large
// without writing, and, its buffer grown, allocates nothing.
func TestWriter(t *testing.T) {
	a, b := socketPair(t)
	w := &Writer{Conn: a}
	want := Frame{Op: OpData, Flags: 1, Req: 2, Handle: 3, Arg: 4, Arg2: 5, Payload: []byte("hello")}
	if err := w.Write(&want); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(&Frame{Op: OpData, Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrTooBig) {
		t.Fatalf("a payload over MaxPayload: %v, want ErrTooBig", err)
	}
	if err := w.WriteMsg(&Frame{Op: OpEOF, Handle: 3}, nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, MaxFrame+1)
	for _, want := range []Frame{want, {Op: OpEOF, Handle: 3}} {
		n, err := b.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if got.Op != want.Op || got.Flags != want.Flags || got.Req != want.Req || got.Handle != want.Handle || got.Arg != want.Arg || got.Arg2 != want.Arg2 || string(got.Payload) != string(want.Payload) {
			t.Fatalf("read %+v, want %+v", got, want)
		}
	}

	f := &Frame{Op: OpData, Handle: 3, Payload: make([]byte, 4096)}
	if allocs := testing.AllocsPerRun(100, func() {
		if err := w.Write(f); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Read(buf); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("Write: %v allocations a frame, want 0", allocs)
	}
}

// BenchmarkWriter is a frame of 4 KiB written and read back.
func BenchmarkWriter(b *testing.B) {
	c, d := socketPair(b)
	w := &Writer{Conn: c}
	f := &Frame{Op: OpData, Handle: 3, Payload: make([]byte, 4096)}
	buf := make([]byte, MaxFrame+1)
	b.SetBytes(int64(len(f.Payload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := w.Write(f); err != nil {
			b.Fatal(err)
		}
		if _, err := d.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}

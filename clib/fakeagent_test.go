package clib_test

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// fakeAgent serves one connection per variant on a unixpacket socket,
// answering as serve says: a hostile or broken agent.
func fakeAgent(t *testing.T, serve func(c *net.UnixConn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return path
}

func encode(t testing.TB, f frame.Frame) []byte {
	b, err := frame.Append(nil, &f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCMalformedAgent: whatever the agent sends, libvconn returns a clear
// error (never crashes, never reads out of bounds: the sanitizers watch).
func TestCMalformedAgent(t *testing.T) {
	helloOK := func(req uint32) []byte {
		return encode(t, frame.Frame{Op: frame.OpOK, Req: req, Arg: frame.Version,
			Payload: frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "fake"})})
	}
	// reqOf reads the request's id; 0 if the client sent nothing.
	next := func(c *net.UnixConn) uint32 {
		b := make([]byte, frame.MaxFrame)
		n, err := c.Read(b)
		if err != nil {
			return 0
		}
		f, err := frame.Decode(b[:n])
		if err != nil {
			return 0
		}
		return f.Req
	}
	afterHello := func(reply func(req uint32) []byte) func(c *net.UnixConn) {
		return func(c *net.UnixConn) {
			_, _ = c.Write(helloOK(next(c)))
			if b := reply(next(c)); b != nil {
				_, _ = c.Write(b)
			}
			_, _ = io.Copy(io.Discard, c)
		}
	}
	onHello := func(reply func(req uint32) []byte) func(c *net.UnixConn) {
		return func(c *net.UnixConn) {
			if b := reply(next(c)); b != nil {
				_, _ = c.Write(b)
			}
		}
	}
	mutate := func(b []byte, f func([]byte)) []byte { f(b); return b }
	for _, tc := range []struct {
		name  string
		serve func(*net.UnixConn)
		want  string
	}{
		{"garbage", onHello(func(uint32) []byte { return []byte{1, 2, 3} }), "open=-71 "},
		{"version byte", onHello(func(r uint32) []byte { return mutate(helloOK(r), func(b []byte) { b[0] = 2 }) }), "open=-71 "},
		{"length", onHello(func(r uint32) []byte { return mutate(helloOK(r), func(b []byte) { b[27]++ }) }), "open=-71 "},
		{"flags", onHello(func(r uint32) []byte { return mutate(helloOK(r), func(b []byte) { b[2] = 0xff }) }), "open=-71 "},
		{"oversized", onHello(func(r uint32) []byte {
			b := append(helloOK(r), make([]byte, frame.MaxFrame)...)[:frame.MaxFrame+1]
			binary.BigEndian.PutUint32(b[24:], frame.MaxPayload+1)
			return b
		}), "open=-71 "},
		{"short hello info", onHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpOK, Req: r, Arg: frame.Version, Payload: []byte{0, 0, 0, 4, 0}})
		}), "open=-71 "},
		{"wrong version", onHello(func(r uint32) []byte {
			return mutate(helloOK(r), func(b []byte) { b[15] = 2 })
		}), "open=-93 "},
		{"version refused", onHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Req: r, Arg: uint32(frame.CodeVersion), Payload: []byte("speaks 2")})
		}), "open=-93 "},
		{"hang up", onHello(func(uint32) []byte { return nil }), "open=-107 "},
		{"dial answered with garbage", afterHello(func(uint32) []byte { return []byte("not a frame at all, nothing like one") }), "dial=-71 "},
		{"dial answered with a request", afterHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpListen, Req: r})
		}), "dial=-71 "},
		{"dial refused", afterHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Req: r, Arg: uint32(frame.CodeRefused), Payload: []byte("nobody")})
		}), "dial=-111 "},
		{"dial code unknown", afterHello(func(r uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Req: r, Arg: 4000})
		}), "dial=-121 "},
		// An Error with req 0 and handle 0 ends the session at once, with
		// the agent's reason, though the connection stays open.
		{"session ended", afterHello(func(uint32) []byte {
			return encode(t, frame.Frame{Op: frame.OpError, Arg: uint32(frame.CodeBadRequest), Payload: []byte("you lost track")})
		}), "dial=-22 (bad request: the agent ended the session: you lost track)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runC(t, "test_fakeagent", "VCONN_SOCK="+fakeAgent(t, tc.serve))
			if !strings.Contains(out, tc.want) {
				t.Fatalf("want %q in the output", tc.want)
			}
		})
	}
}

// TestCHostileSharedMemory: a fake agent that answers Shm with a segment
// the client must not trust (unsealed, too small, a bad layout, missing
// or wrong descriptors, a ring whose indices lie) gets a clear error from
// libvconn, never a crash or an access outside the mapping.
func TestCHostileSharedMemory(t *testing.T) {
	layout := shm.DefaultLayout
	memfd := func(t *testing.T, size int, seal bool) int {
		fd, err := unix.MemfdCreate("fake", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Error(err) // on the fake agent's goroutine: no Fatal
		}
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			t.Error(err) // on the fake agent's goroutine: no Fatal
		}
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
		}
		return fd
	}
	bells := func(t *testing.T) (mine, theirs [2]int) {
		for i := range 2 {
			p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
			mine[i], theirs[i] = p[0], p[1]
		}
		return mine, theirs
	}
	// rxLies gives the client a sound segment, then, once it has it,
	// writes into ring RX what lie does and rings RX's doorbell.
	rxLies := func(t *testing.T, lie func(rx []byte)) ([]byte, []int, func()) {
		mine, b := bells(t)
		fd := memfd(t, layout.Size(), true)
		mem, err := unix.Mmap(fd, 0, layout.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Error(err) // on the fake agent's goroutine: no Fatal
		}
		t.Cleanup(func() { _ = unix.Munmap(mem) })
		return shm.AppendLayout(nil, layout), []int{fd, b[0], b[1]}, func() {
			lie(mem[layout.Size()/2:])
			_, _ = unix.Write(mine[1], []byte{1})
		}
	}
	for _, tc := range []struct {
		name string
		// segment returns the Shm reply's payload and descriptors, and
		// what to do to the mapping once the client has it.
		segment func(t *testing.T) (payload []byte, fds []int, after func())
		want    string
	}{
		{"unsealed", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size(), false), b[0], b[1]}, nil
		}, "dial=-71 "},
		{"too small", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size()/2, true), b[0], b[1]}, nil
		}, "dial=-71 "},
		{"bad layout", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			l := layout
			l.Entries = 3
			return shm.AppendLayout(nil, l), []int{memfd(t, layout.Size(), true), b[0], b[1]}, nil
		}, "dial=-71 "},
		{"two descriptors", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size(), true), b[0]}, nil
		}, "dial=-71 "},
		{"doorbell not a stream", func(t *testing.T) ([]byte, []int, func()) {
			_, b := bells(t)
			p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Error(err) // on the fake agent's goroutine: no Fatal
			}
			return shm.AppendLayout(nil, layout), []int{memfd(t, layout.Size(), true), b[0], p[0]}, nil
		}, "dial=-71 "},
		{"ring tail lies", func(t *testing.T) ([]byte, []int, func()) {
			return rxLies(t, func(rx []byte) {
				binary.LittleEndian.PutUint32(rx, 1000) // tail: 1000 descriptors in a ring of 256
			})
		}, "recv=-71 "},
		{"descriptor outside the slab", func(t *testing.T) ([]byte, []int, func()) {
			return rxLies(t, func(rx []byte) {
				d := rx[256:]
				binary.LittleEndian.PutUint32(d, layout.Slab-8) // off
				binary.LittleEndian.PutUint32(d[4:], 4096)      // len: past the slab's end
				binary.LittleEndian.PutUint32(rx, 1)            // tail
			})
		}, "recv=-71 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeAgent(t, func(c *net.UnixConn) {
				b := make([]byte, frame.MaxFrame)
				var after func()
				for {
					n, err := c.Read(b)
					if err != nil || n == 0 {
						return
					}
					f, err := frame.Decode(b[:n])
					if err != nil {
						return
					}
					var rep frame.Frame
					var fds []int
					switch f.Op {
					case frame.OpHello:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: frame.Version,
							Payload: frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "fake"})}
					case frame.OpDial:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: 1, Payload: f.Payload}
					case frame.OpShm:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: 1}
						rep.Payload, fds, after = tc.segment(t)
					default:
						rep = frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle}
					}
					if f.Op == frame.OpGrant {
						continue
					}
					out := encode(t, rep)
					var oob []byte
					if len(fds) > 0 {
						oob = unix.UnixRights(fds...)
					}
					_, _, err = c.WriteMsgUnix(out, oob, nil)
					for _, fd := range fds {
						_ = unix.Close(fd)
					}
					if err != nil {
						return
					}
					if after != nil {
						after()
						after = nil
					}
				}
			})
			out := runC(t, "test_fakeagent", "VCONN_SOCK="+sock, "VCONN_SHM=1")
			if !strings.Contains(out, tc.want) {
				t.Fatalf("want %q in the output", tc.want)
			}
		})
	}
}

package shm

import (
	"bytes"
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// passRights sends the segment's descriptors over a unix socketpair with
// SCM_RIGHTS, as the agent does, and returns what arrives.
func passRights(t *testing.T, fds []int) []int {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*net.UnixConn)
	}
	a, b := conn(pair[0]), conn(pair[1])
	if _, _, err := a.WriteMsgUnix([]byte("shm"), Rights(fds), nil); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 16), make([]byte, RightsSpace)
	_, oobn, _, _, err := b.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseRights(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func pair(t *testing.T, l Layout) (agent, pod *Segment) {
	t.Helper()
	agent, err := Create("test", l)
	if err != nil {
		t.Fatal(err)
	}
	fds := passRights(t, agent.Files())
	agent.ClosePeer()
	if pod, err = Open(l, fds); err != nil {
		t.Fatal(err)
	}
	return agent, pod
}

// TestSegmentEcho runs messages pod → agent → pod through both rings of a
// real memfd, with both sides sleeping on their doorbells when idle.
func TestSegmentEcho(t *testing.T) {
	agent, pod := pair(t, small)
	aTX, aRX := agent.Agent()
	pTX, pRX := pod.Pod()
	const n = 2000
	done := make(chan error, 1)
	go func() { // the agent: echo TX to RX
		for i := 0; i < n; i++ {
			var (
				d   Desc
				b   []byte
				ok  bool
				err error
			)
			for {
				if d, b, ok, err = aTX.Peek(); err != nil || ok {
					break
				}
				if !aTX.Arm() {
					if _, err = aTX.Wait(-1); err != nil {
						break
					}
				}
			}
			if err != nil {
				done <- err
				return
			}
			for {
				ok, err := aRX.Push(b, d.Imm, d.Flags)
				if err != nil {
					done <- err
					return
				}
				if ok {
					break
				}
				aRX.Arm()
				if ok, _ := aRX.Push(b, d.Imm, d.Flags); ok {
					break
				}
				if _, err := aRX.Wait(-1); err != nil {
					done <- err
					return
				}
			}
			aTX.Release()
		}
		done <- nil
	}()
	msg := []byte("ping ping ping")
	for i := 0; i < n; i++ {
		for {
			ok, err := pTX.Push(msg, uint32(i), FlagImm)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			pTX.Arm()
			if _, err := pTX.Wait(-1); err != nil {
				t.Fatal(err)
			}
		}
		for {
			d, b, ok, err := pRX.Peek()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				if d.Imm != uint32(i) || !bytes.Equal(b, msg) {
					t.Fatalf("echo %d: %+v %q", i, d, b)
				}
				pRX.Release()
				break
			}
			if !pRX.Arm() {
				if _, err := pRX.Wait(-1); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := pod.Close(); err != nil {
		t.Fatal(err)
	}
	if err := agent.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownWakes checks that Shutdown ends a Wait, and that the pod
// closing its end wakes the agent too.
func TestShutdownWakes(t *testing.T) {
	agent, pod := pair(t, small)
	aTX, _ := agent.Agent()
	var wg sync.WaitGroup
	wg.Add(1)
	errc := make(chan error, 1)
	go func() {
		defer wg.Done()
		_, err := aTX.Wait(-1)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	agent.Shutdown()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Wait returned nil after Shutdown")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after Shutdown")
	}
	wg.Wait()
	_ = agent.Close()
	_ = pod.Close()
}

// TestOpenRejects checks the pod refuses descriptors that are not a
// sealed memfd of the layout's size, and closes them.
func TestOpenRejects(t *testing.T) {
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(small.Size())); err != nil {
		t.Fatal(err)
	}
	a, b, err := newBellPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	fa, _ := a.dupFD()
	fb, _ := b.dupFD()
	if _, err := Open(small, []int{fd, fa, fb}); err == nil {
		t.Fatal("opened an unsealed memfd")
	}
	if err := unix.Close(fd); !errors.Is(err, unix.EBADF) {
		t.Errorf("Open left the memfd open: %v", err)
	}
	// A doorbell that is not a socket.
	seg, err := Create("test", small)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	fds := passRights(t, seg.Files())
	_ = unix.Close(fds[1])
	fds[1], _ = unix.Dup(fds[0])
	if _, err := Open(small, fds); !errors.Is(err, ErrNotBell) {
		t.Fatalf("doorbell that is a memfd: %v", err)
	}
	// A layout larger than the memfd.
	fds = passRights(t, seg.Files())
	if _, err := Open(DefaultLayout, fds); err == nil {
		t.Fatal("opened a memfd smaller than the layout")
	}
}

// BenchmarkSegmentRTT is the hop alone: a 64-byte message pod → agent →
// pod through both rings of a memfd, each side polling for spin and then
// sleeping on its doorbell, as the agent and vconn do.
func BenchmarkSegmentRTT(b *testing.B) {
	for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run("spin="+spin.String(), func(b *testing.B) {
			l := DefaultLayout
			agent, err := Create("bench", l)
			if err != nil {
				b.Fatal(err)
			}
			fds := make([]int, 0, 3)
			for _, fd := range agent.Files() {
				d, _ := unix.Dup(fd)
				fds = append(fds, d)
			}
			agent.ClosePeer()
			pod, err := Open(l, fds)
			if err != nil {
				b.Fatal(err)
			}
			defer pod.Close()
			defer agent.Close()
			aTX, aRX := agent.Agent()
			pTX, pRX := pod.Pod()
			wait := func(c *Consumer) (Desc, []byte) {
				start := time.Now()
				for {
					d, p, ok, err := c.Peek()
					if err != nil {
						b.Error(err)
						return d, nil
					}
					if ok {
						return d, p
					}
					if time.Since(start) < spin {
						runtime.Gosched()
						continue
					}
					if !c.Arm() {
						if _, err := c.Wait(-1); err != nil {
							return d, nil
						}
					}
				}
			}
			go func() {
				for {
					d, p := wait(aTX)
					if p == nil {
						return
					}
					_, _ = aRX.Push(p, d.Imm, d.Flags)
					aTX.Release()
				}
			}()
			msg := make([]byte, 64)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = pTX.Push(msg, 0, 0)
				if _, p := wait(pRX); p == nil {
					b.Fatal("pod ring shut")
				}
				pRX.Release()
			}
			agent.Shutdown()
		})
	}
}

// TestWaitPeerClose checks that the other side closing its end ends a
// Wait for room, though shared memory shows none, and that the next Wait
// reports the close.
func TestWaitPeerClose(t *testing.T) {
	agent, pod := pair(t, small)
	defer agent.Close()
	_, aRX := agent.Agent()
	msg := make([]byte, 64)
	for {
		ok, err := aRX.Push(msg, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
	}
	aRX.Arm()
	errc := make(chan error, 1)
	go func() {
		_, err := aRX.Wait(-1)
		if err == nil {
			_, err = aRX.Wait(-1)
		}
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	_ = pod.Close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Wait after the pod closed returned no error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after the pod closed")
	}
}

// TestWaitAllocs asserts a Wait that finds a descriptor published
// allocates nothing.
func TestWaitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts do not hold under the race detector")
	}
	agent, pod := pair(t, small)
	defer agent.Close()
	defer pod.Close()
	pTX, _ := pod.Pod()
	aTX, _ := agent.Agent()
	msg := make([]byte, 64)
	n := testing.AllocsPerRun(100, func() {
		if ok, err := pTX.Push(msg, 0, 0); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if ok, err := aTX.Wait(-1); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, _, ok, err := aTX.Peek(); !ok || err != nil {
			t.Fatal(ok, err)
		}
		aTX.Release()
	})
	if n != 0 {
		t.Errorf("%v allocations per push/wait/peek/release", n)
	}
}

// TestMemfdSealed: what a pod holding the memfd NewMemfd made can try
// against the agent's mapping fails (shrink, grow, unseal, seal writes),
// the agent's mapping still reads what the pod wrote through its own, and
// MapMemfd refuses a memfd smaller than asked.
func TestMemfdSealed(t *testing.T) {
	fd, mem, err := NewMemfd("test", 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(mem)
	pod := passRights(t, []int{fd})[0]
	_ = unix.Close(fd)
	defer unix.Close(pod)
	for _, size := range []int64{0, 4096, 9999, 10001, 1 << 20} {
		if err := unix.Ftruncate(pod, size); !errors.Is(err, unix.EPERM) {
			t.Errorf("ftruncate to %d: %v, want EPERM", size, err)
		}
	}
	if err := unix.Fallocate(pod, 0, 0, 1<<20); !errors.Is(err, unix.EPERM) {
		t.Errorf("fallocate past the end: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(uintptr(pod), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
		t.Errorf("add F_SEAL_WRITE: %v, want EPERM", err)
	}
	if _, err := MapMemfd(pod, 10001); err == nil {
		t.Error("mapped 10001 bytes of a memfd of 10000")
	}
	m, err := MapMemfd(pod, 10000)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(m)
	copy(m[9990:], "written by the pod")
	if got := string(mem[9990:10000]); got != "written by" {
		t.Errorf("the agent's mapping reads %q", got)
	}
	var st unix.Stat_t
	if err := unix.Fstat(pod, &st); err != nil || st.Size != 10000 {
		t.Errorf("size %d, %v: want 10000", st.Size, err)
	}
}

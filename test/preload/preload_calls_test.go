package preload_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// How the preload library treats a bad variable and the calls programs
// make around their sockets: fork, dup, sendfile.

// TestPreloadBadVariable: a malformed variable stops the program at start
// and says which variable and which entry.
func TestPreloadBadVariable(t *testing.T) {
	need(t, "make", "cc")
	lib := filepath.Join(build(t), "librdmavisor-preload.so")
	for _, c := range []struct{ name, value, says string }{
		{"RDMAVISOR_PRELOAD_CONNECT", "10.0.0.1", `bad entry "10.0.0.1"`},
		{"RDMAVISOR_PRELOAD_CONNECT", "10.0.0.1:99999", `bad entry "10.0.0.1:99999"`},
		{"RDMAVISOR_PRELOAD_CONNECT", "*:*", `bad entry "*:*"`},
		{"RDMAVISOR_PRELOAD_CONNECT", "10.0.0.1:80,,", `bad entry ""`},
		{"RDMAVISOR_PRELOAD_LISTEN", "http", `bad entry "http"`},
		{"RDMAVISOR_PRELOAD_LISTEN", "0", `bad entry "0"`},
	} {
		cmd := exec.Command("true")
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "RDMAVISOR_SOCKET=/nonexistent", c.name+"="+c.value)
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !bytes.Contains(out, []byte(c.name)) || !bytes.Contains(out, []byte(c.says)) {
			t.Errorf("%s=%q: exit %v, output %q; want exit 2 naming the variable and %s", c.name, c.value, err, out, c.says)
		}
	}
	cmd := exec.Command("true")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "RDMAVISOR_SOCKET=", "RDMAVISOR_PRELOAD_LISTEN=80")
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !bytes.Contains(out, []byte("RDMAVISOR_SOCKET")) {
		t.Errorf("no socket: %q, want exit 2 naming RDMAVISOR_SOCKET", out)
	}
}

// TestPreloadFork: a pre-forking server (two children accept on one
// listening socket) and a client that forks: the child talks on the
// inherited socket and exits, the parent goes on on the same one.
func TestPreloadFork(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	h.servers(t, "forkecho")
	dir := filepath.Dir(h.lib)
	const port = "7100"
	h.start(h.env(h.server, "", port), filepath.Join(dir, "forkecho"), "server", h.ip, port)
	h.waitListen(1)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(filepath.Join(dir, "forkecho"), "client", h.ip, port)
			cmd.Env = h.env(h.client, h.ip+":"+port, "")
			out, err := cmd.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("child ok")) || !bytes.Contains(out, []byte("parent ok")) {
				errs <- fmt.Errorf("client %d: %v: %s", i, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// vconnServer listens on port of node-a for the subtest with a client of
// its own, and hands each vconn it accepts to serve; accepted says when
// serve returned, with what it returned.
func (h *harness) vconnServer(t *testing.T, id string, port int, serve func(*vconn.Conn) error) (accepted <-chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := h.cluster.Nodes[0].Client(ctx, id, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ln, err := c.Listen(ctx, fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	done := make(chan error, 1)
	go func() {
		conn, err := ln.AcceptVConn()
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		done <- serve(conn)
	}()
	return done
}

// TestPreloadDup: a TCP program's socket, a vconn under the preload
// library, copied with dup, dup2 and dup3: every copy echoes through the
// one vconn and names its peer, a line written on one copy is read on
// another, the copies are closed one by one with the others still
// echoing, and the vconn ends (the peer reads its end) once the last
// copy is closed, not before.
func TestPreloadDup(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	const port = 7200
	var echoed atomic.Int64
	done := h.vconnServer(t, "dup-server", port, func(c *vconn.Conn) error {
		n, err := io.Copy(c, c) // to the end of the program's last copy
		echoed.Store(n)
		return err
	})
	out := h.run(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, port), ""), nil, filepath.Join(filepath.Dir(h.lib), "dupsend"), "dup", h.ip, strconv.Itoa(port))
	if string(out) != "dup ok\n" {
		t.Fatalf("dupsend dup printed %q", out)
	}
	select {
	case err := <-done:
		// 4 lines, "across", and the lines after each of the 3 closes.
		want := int64(0)
		for i := range 4 {
			want += int64(len(fmt.Sprintf("on copy %d\n", i)))
		}
		want += int64(len("across\n"))
		for i := range 3 {
			for j := i + 1; j < 4; j++ {
				want += int64(len(fmt.Sprintf("copy %d after closing %d\n", j, i)))
			}
		}
		if err != nil || echoed.Load() != want {
			t.Fatalf("the vconn echoed %d bytes, then %v; want %d bytes, then its end", echoed.Load(), err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the program closed every copy and exited, and its vconn has not ended")
	}
}

// TestPreloadSendfile: a TCP program sends a file of 3 MiB and a few bytes
// with sendfile, half through the file's offset and half from offsets of
// its own, into its socket, a vconn under the preload library; the peer
// reads every byte, in order, then the end.
func TestPreloadSendfile(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	const port = 7201
	file := make([]byte, 3<<20+12345)
	_, _ = rand.Read(file)
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	done := h.vconnServer(t, "sendfile-server", port, func(c *vconn.Conn) error {
		_, err := io.Copy(&got, c)
		return err
	})
	out := h.run(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, port), ""), nil, filepath.Join(filepath.Dir(h.lib), "dupsend"), "sendfile", h.ip, strconv.Itoa(port), path)
	if want := fmt.Sprintf("sendfile ok %d\n", len(file)); string(out) != want {
		t.Fatalf("dupsend sendfile printed %q, want %q", out, want)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("reading the vconn: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the peer read %d bytes and no end in 30s", got.Len())
	}
	if !bytes.Equal(got.Bytes(), file) {
		i := 0
		for i < min(got.Len(), len(file)) && got.Bytes()[i] == file[i] {
			i++
		}
		t.Fatalf("the peer read %d bytes of %d; the first %d as sent", got.Len(), len(file), i)
	}
}

package preload_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPreloadAddrLen: a TCP program passes connect, bind, getsockname,
// getpeername, accept and accept4 odd lengths (too short, between the
// family's size and a sockaddr_storage's, too long, 4,000,000, negative)
// and pointers (NULL, to no memory, to memory that ends part way); run
// once on TCP and once on vconns under the preload library, every call
// returns the same, with the same errno, the same length and as many bytes
// written, and no case crashes the program (issue 33, finding 5).
func TestPreloadAddrLen(t *testing.T) {
	need(t, "make", "cc")
	h := newHarness(t)
	prog := filepath.Join(filepath.Dir(h.lib), "addrlen")
	const port, bport, sport = 7210, 7211, 7212
	target := fmt.Sprintf("%s:%d", h.ip, port)
	args := []string{"client", h.ip, strconv.Itoa(port), strconv.Itoa(bport)}

	tcpLn, err := net.Listen("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer tcpLn.Close()
	go drainAll(func() (io.ReadCloser, error) { return tcpLn.Accept() })
	tcp := h.run(os.Environ(), nil, prog, args...)

	h.servers(t, "addrlen")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := h.cluster.Nodes[0].Client(ctx, "addrlen-server", 64)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	vln, err := srv.Listen(ctx, fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer vln.Close()
	go drainAll(func() (io.ReadCloser, error) { return vln.AcceptVConn() })
	vc := h.run(h.env(h.client, target, strconv.Itoa(bport)), nil, prog, args...)
	sameLines(t, "client", tcp, vc)

	tcpSrv := h.acceptRun(t, os.Environ(), prog, sport, func(addr string) (io.Closer, error) { return net.Dial("tcp", addr) })
	dialer, err := h.cluster.Nodes[1].Client(ctx, "addrlen-dialer", 32)
	if err != nil {
		t.Fatal(err)
	}
	defer dialer.Close()
	vSrv := h.acceptRun(t, h.env(h.server, "", strconv.Itoa(sport)), prog, sport, func(addr string) (io.Closer, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return dialer.Dial(ctx, addr)
	})
	sameLines(t, "server", tcpSrv, vSrv)
}

// drainAll reads every connection accept gives to its end.
func drainAll(accept func() (io.ReadCloser, error)) {
	for {
		c, err := accept()
		if err != nil {
			return
		}
		go func() {
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}()
	}
}

// acceptRun runs the program as a server on sport and dials it as often
// as it says it will accept, with dial; its output.
func (h *harness) acceptRun(t *testing.T, env []string, prog string, sport int, dial func(string) (io.Closer, error)) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, "server", h.ip, strconv.Itoa(sport))
	cmd.Env = env
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	first, err := r.ReadString('\n')
	var n int
	if _, serr := fmt.Sscanf(first, "listening %d\n", &n); err != nil || serr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("addrlen server: %q, %v; want \"listening N\"", first, err)
	}
	addr := fmt.Sprintf("%s:%d", h.ip, sport)
	for i := range n {
		c, err := dial(addr)
		if err != nil {
			t.Fatalf("dial %d of %d to the addrlen server: %v", i+1, n, err)
		}
		defer c.Close()
	}
	rest, _ := io.ReadAll(r)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("addrlen server: %v\n%s", err, rest)
	}
	return append([]byte(first), rest...)
}

// sameLines fails the test for each case whose line in the preload run
// (vc) is not the TCP run's, and unless both end "crashed 0".
func sameLines(t *testing.T, mode string, tcp, vc []byte) {
	t.Helper()
	tl, vl := strings.Split(strings.TrimSpace(string(tcp)), "\n"), strings.Split(strings.TrimSpace(string(vc)), "\n")
	tr, vr := results(tl), results(vl)
	differ := 0
	for _, l := range append(tl[:len(tl)-1:len(tl)-1], vl[:len(vl)-1]...) {
		name, _, _ := strings.Cut(l, ": ")
		if a, b := tr[name], vr[name]; a != b {
			differ++
			t.Errorf("addrlen %s: %s:\n  TCP:     %s\n  preload: %s", mode, name, a, b)
			delete(tr, name) // once
			delete(vr, name)
		}
	}
	if tl[len(tl)-1] != "crashed 0" || vl[len(vl)-1] != "crashed 0" {
		t.Errorf("addrlen %s: programs crashed: TCP %q, preload %q; want 0", mode, tl[len(tl)-1], vl[len(vl)-1])
	}
	t.Logf("addrlen %s: %d cases on TCP, %d under the preload library, %d differ; %s (preload)", mode, len(tl)-1, len(vl)-1, differ, vl[len(vl)-1])
}

// results maps each case's name to its result.
func results(lines []string) map[string]string {
	m := make(map[string]string, len(lines))
	for _, l := range lines {
		name, r, _ := strings.Cut(l, ": ")
		m[name] = r
	}
	return m
}

package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireRoot fails a test that needs root (network namespaces, iptables).
// CI runs as root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (network namespaces and iptables); CI runs it as root")
	}
}

func sh(t *testing.T, args ...string) {
	t.Helper()
	if b, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// addNetns creates a named network namespace that the test deletes.
func addNetns(t *testing.T, name string) {
	t.Helper()
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
}

// inNetns runs f on a thread in the namespace; sockets f opens stay in it.
// The thread is never unlocked: it exits with its goroutine.
func inNetns(t *testing.T, name string, f func() error) {
	t.Helper()
	errc := make(chan error)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("opening netns %s: %w", name, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering netns %s: %w", name, err)
			return
		}
		errc <- f()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func buildTool(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "impair")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	if b, err := exec.Command(goBin, "build", "-o", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("building impair: %v\n%s", err, b)
	}
	return out
}

// TestImpairUDP sends 10,000 numbered datagrams from one namespace to
// another through the tool's queue, loss 5% reorder 5%, and checks what
// arrives: without delay, and with the 1ms delay the e2e suite asks for
// (the verdicts then go through the tool's delay FIFO).
func TestImpairUDP(t *testing.T) {
	requireRoot(t)
	bin := buildTool(t)
	for _, delay := range []string{"0", "1ms"} {
		t.Run("delay="+delay, func(t *testing.T) { testImpairUDP(t, bin, delay) })
	}
}

func testImpairUDP(t *testing.T, bin, delay string) {
	a, b := fmt.Sprintf("impair-a-%d", os.Getpid()), fmt.Sprintf("impair-b-%d", os.Getpid())
	addNetns(t, a)
	addNetns(t, b)
	sh(t, "ip", "link", "add", "va", "netns", a, "type", "veth", "peer", "name", "vb", "netns", b)
	sh(t, "ip", "-n", a, "addr", "add", "10.213.0.1/24", "dev", "va")
	sh(t, "ip", "-n", b, "addr", "add", "10.213.0.2/24", "dev", "vb")
	for _, ns := range []string{a, b} {
		sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	sh(t, "ip", "-n", a, "link", "set", "va", "up")
	sh(t, "ip", "-n", b, "link", "set", "vb", "up")

	const qnum, port, n = 7, 9999, 10_000
	stats := filepath.Join(t.TempDir(), "stats.json")
	// A file, not a buffer: the test reads it while the tool may write.
	errf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	stderr := func() string { b, _ := os.ReadFile(errf.Name()); return string(b) }
	tool := exec.Command("ip", "netns", "exec", a, bin, "--queue", fmt.Sprint(qnum),
		"--loss", "5%", "--reorder", "5%", "--delay", delay,
		"--seed", "3", "--stats", stats, "--interval", "1s")
	tool.Stderr = errf
	if err := tool.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- tool.Wait() }()
	t.Cleanup(func() {
		if tool.ProcessState == nil {
			_ = tool.Process.Kill()
			<-exited
		}
	})
	// The queue is bound once the tool has written its first counters.
	for i := 0; ; i++ {
		if _, err := os.Stat(stats); err == nil {
			break
		}
		if i == 100 {
			t.Fatalf("the tool did not start; its stderr:\n%s", stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A second tool cannot bind the same queue, and says so.
	out, err := exec.Command("ip", "netns", "exec", a, bin, "--queue", fmt.Sprint(qnum)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), fmt.Sprintf("binding NFQUEUE queue %d", qnum)) {
		t.Errorf("a second tool on queue %d: err %v, output %q; want a failure that names the queue", qnum, err, out)
	}

	sh(t, "ip", "netns", "exec", a, "iptables", "-I", "OUTPUT", "-p", "udp", "-d", "10.213.0.2", "--dport", fmt.Sprint(port),
		"-m", "comment", "--comment", "rdmavisor-impair", "-j", "NFQUEUE", "--queue-num", fmt.Sprint(qnum), "--queue-bypass")

	var rx, tx *net.UDPConn
	inNetns(t, b, func() (err error) {
		rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 213, 0, 2), Port: port})
		return err
	})
	defer rx.Close()
	_ = rx.SetReadBuffer(8 << 20)
	inNetns(t, a, func() (err error) {
		tx, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 213, 0, 2), Port: port})
		return err
	})
	defer tx.Close()

	type result struct{ got, dups, outOfOrder int }
	res := make(chan result, 1)
	go func() {
		var r result
		seen := make([]bool, n)
		last := -1
		buf := make([]byte, 64)
		for {
			_ = rx.SetReadDeadline(time.Now().Add(time.Second))
			m, err := rx.Read(buf)
			if err != nil {
				res <- r
				return
			}
			if m != 8 {
				continue
			}
			seq := int(binary.BigEndian.Uint64(buf))
			if seq >= n {
				continue
			}
			if seen[seq] {
				r.dups++
				continue
			}
			seen[seq] = true
			r.got++
			if seq < last {
				r.outOfOrder++
			}
			last = max(last, seq)
		}
	}()
	msg := make([]byte, 8)
	for i := range n {
		binary.BigEndian.PutUint64(msg, uint64(i))
		if _, err := tx.Write(msg); err != nil {
			t.Fatalf("sending datagram %d: %v", i, err)
		}
		// Paced so neither the queue nor the receiver overflows: only the
		// tool may lose packets.
		if i%50 == 49 {
			time.Sleep(time.Millisecond)
		}
	}
	r := <-res

	if err := tool.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the tool exited with %v on SIGTERM; its stderr:\n%s", err, stderr())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the tool did not exit on SIGTERM; its stderr:\n%s", stderr())
	}
	var fs fileStats
	if b, err := os.ReadFile(stats); err != nil {
		t.Fatal(err)
	} else if err := json.Unmarshal(b, &fs); err != nil {
		t.Fatalf("the stats file %q: %v", b, err)
	}

	lost := n - r.got
	t.Logf("received %d of %d: lost %d (%.2f%%), out of order %d, duplicated %d; tool: %+v",
		r.got, n, lost, 100*float64(lost)/n, r.outOfOrder, r.dups, fs)
	if lost < n*3/100 || lost > n*7/100 {
		t.Errorf("lost %d of %d, want 3%% to 7%%", lost, n)
	}
	if r.outOfOrder == 0 {
		t.Error("no datagram arrived out of order")
	}
	if r.dups != 0 {
		t.Errorf("%d datagrams duplicated", r.dups)
	}
	if fs.Packets != n || int(fs.Dropped) != lost {
		t.Errorf("the tool counted %d packets and %d dropped; the receiver saw %d sent and %d lost", fs.Packets, fs.Dropped, n, lost)
	}
	if !strings.Contains(stderr(), fmt.Sprintf("packets %d dropped %d reordered %d", fs.Packets, fs.Dropped, fs.Reordered)) {
		t.Errorf("the tool's last stderr line does not give its counters:\n%s", stderr())
	}
}

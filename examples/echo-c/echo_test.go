package echoc_test

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/echotest"
)

// build makes the static binary with the Makefile.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("make", "BUILD="+dir, "CC=cc", "CFLAGS=-O2 -Werror")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "echo")
	// Static: the binary is the whole image (no interpreter to load).
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked", bin)
		}
	}
	return bin
}

// TestEchoC runs the C client against the C server on another agent: two
// vconns of 300 messages of 3,000 bytes, every byte checked.
func TestEchoC(t *testing.T) {
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, srvSock, cliSock := echotest.Agents(ctx, t)
	tmp := t.TempDir()
	ready, v := filepath.Join(tmp, "ready"), filepath.Join(tmp, "verdict")

	// The client starts first: its dials are refused until the server
	// listens, and it retries.
	client := exec.CommandContext(ctx, bin, "client", "--addr", cl.Nodes[1].Name+":7000", "--conns=2",
		"--messages", "300", "--size=3000", "--timeout=1m", "--verdict="+v)
	client.Env = append(os.Environ(), "RDMAVISOR_SOCKET="+cliSock)
	var cout bytes.Buffer
	client.Stdout, client.Stderr = &cout, &cout
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	server := exec.CommandContext(ctx, bin, "server", "--port=7000", "--ready", ready)
	server.Env = append(os.Environ(), "RDMAVISOR_SOCKET="+srvSock)
	var sout bytes.Buffer
	server.Stdout, server.Stderr = &sout, &sout
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = server.Process.Kill()
		_ = server.Wait()
	}()
	if err := client.Wait(); err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, cout.String(), sout.String())
	}
	if !strings.HasPrefix(cout.String(), "echo: OK 2 vconns, 600 messages of 3000 bytes checked in ") {
		t.Fatalf("client printed %q", cout.String())
	}
	t.Logf("%s", strings.TrimSpace(cout.String()))
	echotest.CheckOK(t, v, 600)
	// The server said where it listens; show prints it, as a probe reads it.
	echotest.CheckShow(t, exec.Command(bin, "show", ready), 7000)

	// A SIGTERM stops the server, which exits 0 (a pod deleted).
	if err := server.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := server.Wait(); err != nil {
		t.Fatalf("server after SIGINT: %v\n%s", err, sout.String())
	}
	if !strings.Contains(sout.String(), "echoed 300 messages") {
		t.Fatalf("server log:\n%s", sout.String())
	}

	// Nothing listens any more: the client gives up at its timeout, exits
	// 1 and says why in its verdict.
	fail := exec.CommandContext(ctx, bin, "client", "--addr="+cl.Nodes[1].Name+":7000", "--conns=1", "--timeout=1s", "--verdict="+v)
	fail.Env = append(os.Environ(), "RDMAVISOR_SOCKET="+cliSock)
	out, err := fail.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "connection refused") {
		t.Fatalf("client without a server: %v, %q", err, out)
	}
	echotest.CheckFailed(t, v, "connection refused")
}

// Bad flags are refused with a clear message, before the agent is asked.
func TestEchoCFlags(t *testing.T) {
	bin := build(t)
	for args, want := range map[string]string{
		"client --size=0":          "--size 0: want a whole number from 1 to 65536",
		"client --timeout=5x":      "--timeout 5x: want e.g. 90s",
		"server --addr=x:1":        "server: unknown flag or missing value --addr=x:1",
		"sing":                     `unknown command "sing"`,
		"show /nonexistent/ready":  "show /nonexistent/ready: nothing written yet",
		"client --messages=-1":     "--messages -1: want a whole number",
		"client --conns":           "client: unknown flag or missing value --conns",
		"client --addr=a:1 --hold": "RDMAVISOR_SOCKET",
	} {
		cmd := exec.Command(bin, strings.Fields(args)...)
		cmd.Env = []string{}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("echo %s: %v, %q; want %q", args, err, out, want)
		}
	}
}

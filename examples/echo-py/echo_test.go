package echopy_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/echotest"
)

// venv installs python/ with pip into a virtual environment of Debian's
// /usr/bin/python3 (the interpreter the image carries; a python3 earlier
// on PATH, pyenv's, would shadow it): its interpreter.
func venv(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatal("/usr/bin/python3 is not installed: run hack/deps.sh test (Debian python3, python3-venv)")
	}
	tmp := t.TempDir()
	// A copy: what pip writes next to the sources stays out of the tree.
	src := filepath.Join(tmp, "src")
	err := filepath.WalkDir("../../python", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() == "__pycache__" {
			if err == nil {
				err = filepath.SkipDir
			}
			return err
		}
		rel, _ := filepath.Rel("../../python", p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(src, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(src, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	env := filepath.Join(tmp, "venv")
	for _, args := range [][]string{
		{py, "-m", "venv", env},
		{filepath.Join(env, "bin", "python"), "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation", src},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return filepath.Join(env, "bin", "python")
}

// buildC makes the C example (examples/echo-c) with its Makefile.
func buildC(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("make", "-C", "../echo-c", "BUILD="+dir, "CC=cc")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make: %v\n%s", err, out)
	}
	return filepath.Join(dir, "echo")
}

// start starts cmd with the allocation's socket, its output in out.
func start(t *testing.T, cmd *exec.Cmd, sock string, out *bytes.Buffer) {
	t.Helper()
	cmd.Env = append(os.Environ(), "RDMAVISOR_SOCKET="+sock, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// TestEchoPy runs the Python client against the Python server on another
// agent, then against the C server: two vconns of 200 messages of 3,000
// bytes each time, every byte checked.
func TestEchoPy(t *testing.T) {
	py := venv(t)
	cEcho := buildC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, srvSock, cliSock := echotest.Agents(ctx, t)
	tmp := t.TempDir()
	ready, v := filepath.Join(tmp, "ready"), filepath.Join(tmp, "verdict")
	addr := cl.Nodes[1].Name + ":7000"

	for _, server := range []struct {
		name string
		cmd  []string
	}{
		{"python", []string{py, "echo.py"}},
		{"c", []string{cEcho}},
	} {
		t.Run(server.name+" server", func(t *testing.T) {
			_ = os.Remove(ready)
			// The client starts first: its dials are refused until the
			// server listens, and it retries.
			var cout, sout bytes.Buffer
			client := exec.CommandContext(ctx, py, "echo.py", "client", "--addr", addr, "--conns=2",
				"--messages", "200", "--size=3000", "--timeout=1m", "--verdict="+v)
			start(t, client, cliSock, &cout)
			time.Sleep(300 * time.Millisecond)
			srv := exec.CommandContext(ctx, server.cmd[0], append(server.cmd[1:], "server", "--port=7000", "--ready="+ready)...)
			start(t, srv, srvSock, &sout)
			if err := client.Wait(); err != nil {
				_ = srv.Process.Kill()
				_ = srv.Wait()
				t.Fatalf("client: %v\n%s\nserver:\n%s", err, cout.String(), sout.String())
			}
			if !strings.HasPrefix(cout.String(), "echo: OK 2 vconns, 400 messages of 3000 bytes checked in ") {
				t.Fatalf("client printed %q", cout.String())
			}
			t.Logf("%s", strings.TrimSpace(cout.String()))
			echotest.CheckOK(t, v, 400)
			// The server said where it listens; show prints it, as a probe reads it.
			echotest.CheckShow(t, exec.Command(py, "echo.py", "show", ready), 7000)
			// SIGTERM stops the server, which exits 0 (a pod deleted).
			if err := srv.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			if err := srv.Wait(); err != nil {
				t.Fatalf("server after SIGINT: %v\n%s", err, sout.String())
			}
			if !strings.Contains(sout.String(), "echoed 200 messages") {
				t.Fatalf("server log:\n%s", sout.String())
			}
		})
	}

	// Nothing listens any more: the client gives up at its timeout, exits
	// 1 and says why in its verdict.
	fail := exec.CommandContext(ctx, py, "echo.py", "client", "--addr="+addr, "--conns=1", "--timeout=1s", "--verdict="+v)
	fail.Env = append(os.Environ(), "RDMAVISOR_SOCKET="+cliSock)
	out, err := fail.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nothing listens") {
		t.Fatalf("client without a server: %v, %q", err, out)
	}
	echotest.CheckFailed(t, v, "")
}

// Bad flags are refused with a clear message, before the agent is asked.
func TestEchoPyFlags(t *testing.T) {
	for args, want := range map[string]string{
		"client --size=x":         "invalid int value: 'x'",
		"client --timeout=5x":     "invalid duration '5x'",
		"server --addr=x:1":       "unrecognized arguments: --addr=x:1",
		"sing":                    "invalid choice: 'sing'",
		"show /nonexistent/ready": "show /nonexistent/ready: nothing written yet",
		"client --addr=a:1":       "RDMAVISOR_SOCKET is not set",
	} {
		cmd := exec.Command("/usr/bin/python3", append([]string{"echo.py"}, strings.Fields(args)...)...)
		cmd.Env = []string{"PYTHONPATH=../../python", "PYTHONDONTWRITEBYTECODE=1"}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("echo.py %s: %v, %q; want %q", args, err, out, want)
		}
	}
}

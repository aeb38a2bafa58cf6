package vconn_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// A session that never started says so, and what to do, rather than that
// an agent connection was lost.
func TestNoAgentSaysWhy(t *testing.T) {
	dir := t.TempDir()
	// A socket file with no one listening, as an agent that stopped leaves.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()

	for _, tt := range []struct {
		name, socket string
		want         []string
	}{
		{"no socket", filepath.Join(dir, "none.sock"), []string{"no agent socket at", "rdmavisor.io/vconn"}},
		{"no listener", stale, []string{"nothing listens on", "retry"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := vconn.NewClient(context.Background(), vconn.Options{Socket: tt.socket})
			if !errors.Is(err, vconn.ErrNoAgent) || errors.Is(err, vconn.ErrAgentGone) {
				t.Fatalf("NewClient: %v, want ErrNoAgent and not ErrAgentGone", err)
			}
			for _, w := range append(tt.want, tt.socket, "cannot connect to the agent") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}

	// A non-root pod without the socket's group: the dial's error as the
	// kernel gives it (as root, this test cannot be refused for real).
	denied := &net.OpError{Op: "dial", Net: "unixpacket", Err: &os.SyscallError{Syscall: "connect", Err: syscall.EACCES}}
	err = vconn.NoAgent("/var/run/rdmavisor/a.sock", denied)
	for _, w := range []string{"permission denied on /var/run/rdmavisor/a.sock", "spec.socketGroup", "supplementalGroups"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %q", err, w)
		}
	}
}

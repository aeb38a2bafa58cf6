package minicluster

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"testing"
	"time"
)

// TestStartRestartClose: both agents serve allocations, a restarted node
// serves again on its addresses, and Close leaves no socket directory.
func TestStartRestartClose(t *testing.T) {
	c, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(c.Nodes) != 2 || c.Nodes[0].Name != "node-a" || c.Nodes[1].IP != "127.0.0.3" {
		t.Fatalf("nodes %+v, want node-a and node-b on 127.0.0.2 and .3", c.Nodes)
	}
	for _, n := range c.Nodes {
		sock, err := n.Allocate(ctx, "t-"+n.Name, 4)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if _, err := os.Stat(sock); err != nil {
			t.Fatalf("%s: allocation socket: %v", n.Name, err)
		}
	}
	b := c.Nodes[1]
	port := b.Config.ControlPort
	if err := b.Restart(); err != nil {
		t.Fatal(err)
	}
	if b.Config.ControlPort != port {
		t.Errorf("restarted on control port %d, was %d", b.Config.ControlPort, port)
	}
	if _, err := b.Allocate(ctx, "t-again", 4); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Close left %s: %v", c.dir, err)
	}
}

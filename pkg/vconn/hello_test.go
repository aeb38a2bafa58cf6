package vconn_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestHelloOtherVersion: an agent that answers Hello with another protocol
// version is refused with an error that says so.
func TestHelloOtherVersion(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, frame.MaxFrame)
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		f, err := frame.Decode(buf[:n])
		if err != nil {
			return
		}
		info := frame.AppendHello(nil, frame.HelloInfo{Quota: 1, SendWindow: 16, MaxMessage: 1024, Node: "n"})
		b, _ := frame.Append(nil, &frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: frame.Version + 1, Payload: info})
		_, _ = c.Write(b)
		_, _ = c.Read(buf) // until the client hangs up
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock, VConns: 1})
	if err == nil {
		_, err = c.Dial(ctx, "10.0.0.1:1")
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "protocol version 2") {
		t.Fatalf("a client of an agent of another version: %v, want an error naming the version", err)
	}
}

package agent_test

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// FuzzSession writes arbitrary datagrams, after a good hello, to a live
// agent's allocation socket; whatever they hold, the agent must go on
// serving a well-behaved client.
func FuzzSession(f *testing.F) {
	enc := func(fr frame.Frame) []byte { b, _ := frame.Append(nil, &fr); return b }
	sep := []byte("|||")
	for _, seed := range [][]byte{
		enc(frame.Frame{Op: frame.OpListen, Req: 2, Arg: 80}),
		bytes.Join([][]byte{enc(frame.Frame{Op: frame.OpListen, Req: 2, Arg: 81}), enc(frame.Frame{Op: frame.OpClose, Req: 3, Handle: 1})}, sep),
		enc(frame.Frame{Op: frame.OpDial, Req: 2, Payload: []byte("node-b:1")}),
		enc(frame.Frame{Op: frame.OpSend, Req: 2, Handle: 1, Payload: []byte("x")}),
		enc(frame.Frame{Op: frame.OpGrant, Handle: 7, Arg: 1 << 31}),
		enc(frame.Frame{Op: frame.OpRead, Req: 2, Handle: 1, Payload: []byte{1}}),
		// A vconn to its own listener, its region in a memfd, its staging
		// memory and a staged write.
		bytes.Join([][]byte{
			enc(frame.Frame{Op: frame.OpListen, Req: 2, Arg: 82}),
			enc(frame.Frame{Op: frame.OpDial, Req: 3, Payload: []byte("node-a:82")}),
			enc(frame.Frame{Op: frame.OpExport, Flags: frame.FlagMemfd, Req: 4, Handle: 2, Arg: 3, Arg2: 4096}),
			enc(frame.Frame{Op: frame.OpStage, Req: 5, Handle: 2, Arg2: 8192}),
			enc(frame.Frame{Op: frame.OpWrite, Flags: frame.FlagMemfd, Req: 6, Handle: 2, Arg: 1, Payload: frame.AppendStaged(nil, 100, 200)}),
			enc(frame.Frame{Op: frame.OpRead, Flags: frame.FlagMemfd, Req: 7, Handle: 2, Arg: 1, Payload: frame.AppendStaged(nil, 8000, 1000)}),
		}, sep),
		{1, 2, 3},
	} {
		f.Add(seed)
	}
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock, err := cl.Nodes[0].Allocate(ctx, "fuzz", 8)
	if err != nil {
		f.Fatal(err)
	}
	hello := enc(frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("unixpacket", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(hello); err != nil {
			t.Fatal(err)
		}
		if fr, err := readFrame(c); err != nil || fr.Op != frame.OpOK {
			t.Fatalf("hello: %+v %v", fr, err)
		}
		for _, d := range bytes.Split(in, sep) {
			if len(d) == 0 {
				continue
			}
			if _, err := c.Write(d); err != nil {
				break
			}
		}
		// Drain what the agent answers.
		buf := make([]byte, frame.MaxFrame)
		for {
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if n, err := c.Read(buf); err != nil || n == 0 {
				break
			}
		}
		goodClient(t, sock, "after fuzz")
	})
}

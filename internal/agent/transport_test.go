package agent_test

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestVConnInfo: the agent tells the application each vconn's transport
// and largest message (in arg2 of the Dial reply and of Accept), the
// transport's own where it carries less than the socket (uc, ud), and
// refuses a Send of one byte more with CodeTooLarge, whatever the client
// library checked.
func TestVConnInfo(t *testing.T) {
	for _, tc := range []struct {
		tr   config.Transport
		want transport.Kind
	}{
		{config.TransportRC, transport.RC},
		{config.TransportUC, transport.UC},
		{config.TransportUD, transport.UD},
		{config.TransportAuto, transport.Auto},
	} {
		t.Run(string(tc.tr), func(t *testing.T) {
			cl := startCluster(t, agenttest.Options{Transport: tc.tr})
			b := appClient(t, cl.Nodes[1], "b", 4)
			ctx := ctxT(t)
			ln, err := b.Listen(ctx, ":9")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan *vconn.Conn, 1)
			go func() {
				c, err := ln.AcceptVConn()
				if err == nil {
					accepted <- c
				}
			}()

			sock, err := cl.Nodes[0].Allocate(ctx, "a", 4)
			if err != nil {
				t.Fatal(err)
			}
			r := dialRaw(t, sock)
			r.send(frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
			f, err := r.recv()
			if err != nil || f.Op != frame.OpOK {
				t.Fatalf("hello: %+v, %v", f, err)
			}
			hello, err := frame.DecodeHello(f.Payload)
			if err != nil {
				t.Fatal(err)
			}
			r.send(frame.Frame{Op: frame.OpDial, Req: 2, Payload: []byte("node-b:9")})
			if f, err = r.recv(); err != nil || f.Op != frame.OpOK || f.Req != 2 {
				t.Fatalf("dial: %+v, %v", f, err)
			}
			h, info := f.Handle, frame.VConnInfoOf(f.Arg2)
			ecfg := cl.Nodes[0].Agent.Engine().Config()
			lo, hi := hello.MaxMessage, hello.MaxMessage // the socket's, on rc and auto
			switch tc.tr {
			case config.TransportUD:
				lo, hi = uint32(ecfg.MTU.Bytes()-64), uint32(ecfg.MTU.Bytes()-1)
			case config.TransportUC:
				lo, hi = uint32(ecfg.ChunkSize-64), uint32(ecfg.ChunkSize-1)
			}
			if info.Transport != tc.want || info.MaxMessage < lo || info.MaxMessage > hi {
				t.Fatalf("dialled vconn: %+v, want transport %v and a max message in %d..%d", info, tc.want, lo, hi)
			}
			select {
			case c := <-accepted:
				defer c.Close()
				if c.Transport() != vconn.Transport(tc.tr) || c.MaxMessage() != int(info.MaxMessage) {
					t.Fatalf("accepted vconn: %q, %d bytes; the dialled one: %+v", c.Transport(), c.MaxMessage(), info)
				}
			case <-ctx.Done():
				t.Fatal("no accept")
			}

			// One byte more, where a frame can carry it (on rc and auto the
			// socket's frame is the limit).
			if info.MaxMessage < frame.MaxPayload {
				r.send(frame.Frame{Op: frame.OpSend, Req: 3, Handle: h, Payload: make([]byte, info.MaxMessage+1)})
				if f, err = r.recv(); err != nil || f.Op != frame.OpError || f.Req != 3 || frame.Code(f.Arg) != frame.CodeTooLarge {
					t.Fatalf("a send of %d bytes: %+v (%s), %v; want error %v", info.MaxMessage+1, f, f.Payload, err, frame.CodeTooLarge)
				}
			}
			r.send(frame.Frame{Op: frame.OpSend, Req: 4, Handle: h, Payload: make([]byte, info.MaxMessage)})
			if f, err = r.recv(); err != nil || f.Op != frame.OpOK || f.Req != 4 {
				t.Fatalf("a send of %d bytes: %+v (%s), %v; want OK", info.MaxMessage, f, f.Payload, err)
			}
		})
	}
}

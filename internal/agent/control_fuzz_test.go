package agent_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
)

// FuzzControl sends arbitrary control-plane requests (the RPC chosen by the
// input's first byte, the rest decoded as its protobuf message) to a live
// agent, as a peer on the network could; whatever they hold, the agent
// answers or refuses, and goes on serving its control plane and its pods.
func FuzzControl(f *testing.F) {
	m := func(rpc byte, msg proto.Message) []byte {
		b, err := proto.Marshal(msg)
		if err != nil {
			f.Fatal(err)
		}
		return append([]byte{rpc}, b...)
	}
	gid := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 2}
	caller := &controlpb.Node{Name: "node-a", ControlAddress: "127.0.0.2:1", Gid: gid, Incarnation: 1}
	for _, seed := range [][]byte{
		m(0, &controlpb.IdentityRequest{Caller: caller}),
		m(1, &controlpb.QPRequest{Gid: gid, Type: 2, Qpn: 0x11, Psn: 5, Mtu: 3}),
		m(1, &controlpb.QPRequest{Gid: gid, Type: 2, Qpn: 0x13, Psn: 5, Mtu: 3, Index: 1, Pool: 2}),
		m(1, &controlpb.QPRequest{Gid: gid, Type: 4, Qpn: 0x12, Mtu: 5, UdQpns: []uint32{1, 2, 3}}),
		m(1, &controlpb.QPRequest{Gid: []byte{1}, Type: 999}),
		m(2, &controlpb.DialRequest{Caller: caller, Port: 7, Vconn: 0x101}),
		m(2, &controlpb.DialRequest{Caller: &controlpb.Node{}, Port: 70000, Vconn: 1}),
		m(3, &controlpb.Beat{Seq: 1, Incarnation: 2}),
		m(2, &controlpb.DialRequest{Caller: caller, Port: 7, Vconn: 0x101, Ip: []byte{10, 244, 1, 5}, FromIp: []byte{10, 244, 0, 5}}),
		m(2, &controlpb.DialRequest{Caller: caller, Port: 7, Vconn: 0x101, Ip: []byte{1, 2, 3}}),
		m(4, &controlpb.Announcement{Caller: caller, PodIps: [][]byte{{10, 244, 0, 5}, gid}}),
		m(4, &controlpb.Announcement{Caller: caller, PodIps: [][]byte{{0, 0, 0, 0}, {1}}}),
		{1, 0xff, 0xff},
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
	sock, err := cl.Nodes[1].Allocate(ctx, "fuzz", 8)
	if err != nil {
		f.Fatal(err)
	}
	target := cl.Nodes[1].Agent.ControlAddress()
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		c := hostileT(t, target)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		body := in[1:]
		switch in[0] % 5 {
		case 0:
			var req controlpb.IdentityRequest
			if proto.Unmarshal(body, &req) == nil {
				_, _ = c.Identity(ctx, &req)
			}
		case 1:
			var req controlpb.QPRequest
			if proto.Unmarshal(body, &req) == nil {
				_, _ = c.ConnectQP(ctx, &req)
			}
		case 2:
			var req controlpb.DialRequest
			if proto.Unmarshal(body, &req) == nil {
				_, _ = c.Dial(ctx, &req)
			}
		case 3:
			var b controlpb.Beat
			if proto.Unmarshal(body, &b) == nil {
				if s, err := c.Heartbeat(ctx); err == nil {
					_ = s.Send(&b)
					_ = s.CloseSend()
					for {
						if _, err := s.Recv(); err != nil {
							break
						}
					}
				}
			}
		case 4:
			var req controlpb.Announcement
			if proto.Unmarshal(body, &req) == nil {
				_, _ = c.Announce(ctx, &req)
			}
		}
		if _, err := c.Identity(ctx, &controlpb.IdentityRequest{}); err != nil {
			t.Fatalf("the agent stopped answering its control plane: %v", err)
		}
		goodClient(t, sock, "after control fuzz")
	})
}

// hostileT is hostile with a test's cleanup, for fuzz bodies.
func hostileT(t *testing.T, target string) controlpb.ControlClient {
	return hostile(t, target, insecure.NewCredentials())
}

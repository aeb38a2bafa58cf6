package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// startCluster starts two agents for one test.
func startCluster(t testing.TB, o agenttest.Options) *agenttest.Cluster {
	t.Helper()
	if testing.Verbose() {
		o.Log = testr.NewWithInterface(t, testr.Options{})
	}
	c, err := agenttest.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

// appClient connects an application (package vconn), as a pod's would, to
// a new allocation of k vconns on n.
func appClient(t testing.TB, n *agenttest.Node, id string, k int) *vconn.Client {
	t.Helper()
	c, err := n.Client(ctxT(t), id, k)
	if err != nil {
		t.Fatalf("client of allocation %s: %v", id, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestAdmin(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100})
	n := cl.Nodes[0]
	ctx := ctxT(t)
	fi, err := os.Stat(n.Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin socket mode %v, want 0600", fi.Mode().Perm())
	}
	ac, err := admin.Dial(ctx, n.Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	st, err := ac.Status(ctx)
	if err != nil || !st.Ready || st.Node != "node-a" || st.Capacity != 100 {
		t.Fatalf("status %+v, %v", st, err)
	}
	// This agent was given its certificate files, not a keeper: a renewal
	// is refused, and says why.
	var aerr *admin.Error
	if _, err := ac.RenewCertificate(ctx); !errors.As(err, &aerr) || aerr.Code != admin.CodeInvalid || !strings.Contains(aerr.Message, "does not request its certificate") {
		t.Fatalf("renewCertificate without a keeper: %v", err)
	}
	al, err := ac.CreateAllocation(ctx, "pod-1", 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(al.Socket); err != nil || al.VConns != 60 {
		t.Fatalf("allocation %+v: %v", al, err)
	}
	for _, tc := range []struct {
		id   string
		k    int
		want error
	}{
		{"pod-1", 1, admin.ErrExists},
		{"pod-2", 41, admin.ErrQuota}, // 60 + 41 > 100
	} {
		if _, err := ac.CreateAllocation(ctx, tc.id, tc.k); !errors.Is(err, tc.want) {
			t.Errorf("create %s/%d: %v, want %v", tc.id, tc.k, err, tc.want)
		}
	}
	for _, bad := range []struct {
		id string
		k  int
	}{{"../x", 1}, {"", 1}, {"UPPER", 1}, {"ok", 0}, {"ok", -1}} {
		var ae *admin.Error
		if _, err := ac.CreateAllocation(ctx, bad.id, bad.k); !errors.As(err, &ae) || ae.Code != "invalid" {
			t.Errorf("create %q/%d: %v, want an invalid error", bad.id, bad.k, err)
		}
	}
	if _, err := ac.CreateAllocation(ctx, "pod-2", 40); err != nil {
		t.Fatal(err)
	}
	list, err := ac.ListAllocations(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if err := ac.DeleteAllocation(ctx, "pod-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(al.Socket); !os.IsNotExist(err) {
		t.Fatalf("socket of a deleted allocation: %v", err)
	}
	if err := ac.DeleteAllocation(ctx, "pod-1"); !errors.Is(err, admin.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	pod := admin.Pod{UID: "uid-1", Namespace: "ns", Name: "p", IPs: []string{"10.0.0.5"}, Netns: "/var/run/netns/x", ContainerID: "c1"}
	if err := ac.RegisterPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := ac.RegisterPod(ctx, admin.Pod{UID: "uid-2", Namespace: "ns", Name: "q", IPs: []string{"nope"}}); err == nil {
		t.Fatal("registered a pod with a bad IP")
	}
	pods, err := ac.ListPods(ctx)
	if err != nil || len(pods) != 1 || pods[0].UID != "uid-1" {
		t.Fatalf("pods %+v, %v", pods, err)
	}
	for i := 0; i < 2; i++ { // idempotent
		if err := ac.UnregisterPod(ctx, "uid-1"); err != nil {
			t.Fatal(err)
		}
	}
	// None is an empty list, which `rdmavisor agent pods` prints as [].
	if pods, err := ac.ListPods(ctx); err != nil || pods == nil || len(pods) != 0 {
		t.Fatalf("pods after the last left: %#v, %v; want an empty list", pods, err)
	}
}

// standaloneAgent starts an agent on the soft provider at ip, with its
// metrics (and health) served on ml.
func standaloneAgent(t *testing.T, node, ip string, with ...func(*agent.Options)) (*agent.Agent, net.Listener) {
	t.Helper()
	dir := t.TempDir()
	pc, err := net.ListenPacket("udp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	_ = pc.Close()
	ctl, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	ml, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.NodeName = node
	cfg.Device.Provider = config.ProviderSoft
	cfg.Soft.BindAddress = ip
	cfg.Soft.UDPPort = port
	cfg.SocketDir = dir
	cfg.AdminSocket = dir + "/admin.sock"
	cfg.PeerDiscovery.Mode = config.DiscoveryStatic
	o := agent.Options{Config: cfg, OpenDevice: device.Open, ControlListener: ctl, MetricsListener: ml}
	for _, f := range with {
		f(&o)
	}
	a, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a, ml
}

// TestHealth checks /healthz and /readyz.
func TestHealth(t *testing.T) {
	// agenttest serves health on an ephemeral port it does not expose:
	// start one agent by hand.
	a, ml := standaloneAgent(t, "node-c", "127.0.0.4")
	defer a.Close()
	for _, p := range []string{"/healthz", "/readyz"} {
		resp, err := httpGet("http://" + ml.Addr().String() + p)
		if err != nil || resp != 200 {
			t.Errorf("%s: %d %v", p, resp, err)
		}
	}
}

// TestBadFrames interleaves malformed and truncated frames on the
// application socket with good clients: the bad ones get an error reply or
// a closed connection, the good ones are served throughout.
func TestBadFrames(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100})
	ctx := ctxT(t)
	sock, err := cl.Nodes[0].Allocate(ctx, "a", 50)
	if err != nil {
		t.Fatal(err)
	}
	hello, _ := frame.Append(nil, &frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	bad := [][]byte{
		{},
		{1},
		hello[:frame.HeaderLen-1],
		append(append([]byte(nil), hello...), 0xff), // length mismatch
		func() []byte { b := append([]byte(nil), hello...); b[0] = 9; return b }(),
		func() []byte { b := append([]byte(nil), hello...); b[1] = 0; return b }(),
		func() []byte { b := append([]byte(nil), hello...); b[1] = byte(frame.OpData); return b }(),     // not a request
		func() []byte { b, _ := frame.Append(nil, &frame.Frame{Op: frame.OpSend, Req: 2}); return b }(), // before hello
		func() []byte { b, _ := frame.Append(nil, &frame.Frame{Op: frame.OpHello, Req: 3, Arg: 99}); return b }(),
		make([]byte, frame.MaxFrame+100),
	}
	var wg sync.WaitGroup
	for round := 0; round < 3; round++ {
		for i, b := range bad {
			wg.Add(2)
			go func() {
				defer wg.Done()
				c, err := net.Dial("unixpacket", sock)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				if i%2 == 1 { // after a good hello
					if _, err := c.Write(hello); err != nil {
						t.Error(err)
						return
					}
					if f, err := readFrame(c); err != nil || f.Op != frame.OpOK {
						t.Errorf("hello: %+v %v", f, err)
						return
					}
				}
				if _, err := c.Write(b); err != nil {
					return // too big for the socket: refused by the kernel
				}
				f, err := readFrame(c)
				if err == nil && f.Op != frame.OpError {
					t.Errorf("bad frame %d: reply %v, want an error", i, f.Op)
				}
				// The connection is closed after the error.
				if f2, err := readFrame(c); err == nil {
					t.Errorf("bad frame %d: connection still open (%v)", i, f2.Op)
				}
			}()
			go func() {
				defer wg.Done()
				goodClient(t, sock, fmt.Sprint(round, i))
			}()
		}
	}
	wg.Wait()
	goodClient(t, sock, "last")
}

// goodClient says hello and listens/closes on a port.
func goodClient(t *testing.T, sock, tag string) {
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Error(err)
		return
	}
	defer c.Close()
	hello, _ := frame.Append(nil, &frame.Frame{Op: frame.OpHello, Req: 1, Arg: frame.Version})
	if _, err := c.Write(hello); err != nil {
		t.Error(err)
		return
	}
	f, err := readFrame(c)
	if err != nil || f.Op != frame.OpOK {
		t.Errorf("good client %s: hello: %+v %v", tag, f, err)
		return
	}
	if _, err := frame.DecodeHello(f.Payload); err != nil {
		t.Error(err)
	}
	// Dial an unknown host: an error reply, the session lives on.
	d, _ := frame.Append(nil, &frame.Frame{Op: frame.OpDial, Req: 2, Payload: []byte("nowhere:1")})
	if _, err := c.Write(d); err != nil {
		t.Error(err)
		return
	}
	if f, err := readFrame(c); err != nil || f.Op != frame.OpError || frame.Code(f.Arg) != frame.CodeUnknownHost || f.Req != 2 {
		t.Errorf("good client %s: dial: %+v %v", tag, f, err)
	}
}

func readFrame(c net.Conn) (frame.Frame, error) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, frame.MaxFrame)
	n, err := c.Read(buf)
	if err != nil {
		return frame.Frame{}, err
	}
	if n == 0 {
		return frame.Frame{}, errors.New("closed")
	}
	return frame.Decode(buf[:n])
}

// TestBadAdmin: malformed admin requests get an error reply; the admin
// socket keeps serving.
func TestBadAdmin(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100})
	ctx := ctxT(t)
	path := cl.Nodes[0].Config.AdminSocket
	for _, req := range []string{"", "{", "[]", `{"version":1,"op":"status"} {}`, `{"version":1,"op":"status","bogus":1}`,
		`{"version":2,"op":"status"}`, `{"version":1,"op":"explode"}`, `{"version":1,"op":"createAllocation"}`} {
		c, err := net.Dial("unixpacket", path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 1<<16)
		n, err := c.Read(buf)
		if req == "" {
			// An empty datagram reads as the end of the connection.
			if err == nil && n != 0 {
				t.Errorf("empty request: reply %q", buf[:n])
			}
		} else if err != nil || !bytesContains(buf[:n], `"error"`) {
			t.Errorf("request %q: reply %q, %v", req, buf[:n], err)
		}
		c.Close()
		ac, err := admin.Dial(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ac.Status(ctx); err != nil {
			t.Fatalf("status after %q: %v", req, err)
		}
		ac.Close()
	}
}

func TestLoadConfig(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	t.Setenv("NODE_IP", "")
	cfg, err := agent.LoadConfig("", agent.Overrides{NodeName: "n1", NodeIP: "127.0.0.9", SocketDir: "/run/rv", ControlPort: 9000,
		Peers: "n2=127.0.0.10:9000, n3=host:9000"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "n1" || cfg.Soft.BindAddress != "127.0.0.9" || cfg.AdminSocket != "/run/rv/admin.sock" ||
		cfg.ControlPort != 9000 || cfg.PeerDiscovery.Mode != config.DiscoveryStatic || len(cfg.PeerDiscovery.Static) != 2 {
		t.Fatalf("config %+v", cfg)
	}
	t.Setenv("NODE_NAME", "env-node")
	t.Setenv("NODE_IP", "10.1.2.3")
	f := t.TempDir() + "/agent.yaml"
	if err := os.WriteFile(f, []byte("apiVersion: rdmavisor.io/v1alpha1\nkind: AgentConfig\ndevice: {provider: soft}\npeerDiscovery: {mode: static}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err = agent.LoadConfig(f, agent.Overrides{}); err != nil || cfg.NodeName != "env-node" || cfg.Soft.BindAddress != "10.1.2.3" {
		t.Fatalf("from file and env: %+v %v", cfg, err)
	}
	for _, tc := range []struct {
		name string
		o    agent.Overrides
	}{
		{"bad peers", agent.Overrides{Peers: "n2"}},
		{"bad port", agent.Overrides{ControlPort: 70000}},
		{"bad ip", agent.Overrides{NodeIP: "not-an-ip"}},
	} {
		if _, err := agent.LoadConfig(f, tc.o); err == nil {
			t.Errorf("%s: no error", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	t.Setenv("NODE_NAME", "")
	if _, err := agent.LoadConfig(f, agent.Overrides{}); err == nil {
		t.Error("no node name: no error")
	}
	if _, err := agent.LoadConfig(t.TempDir()+"/missing.yaml", agent.Overrides{}); err == nil {
		t.Error("missing file: no error")
	}
}

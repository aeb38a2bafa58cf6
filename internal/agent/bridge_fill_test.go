package agent_test

import (
	"bytes"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// bridgePair is a bridged dial from node b to a bridged listener of node
// a: the program's two sockets, the dialler's and the accepted one.
func bridgePair(t *testing.T, cl *agenttest.Cluster, port uint32) (client, server net.Conn) {
	t.Helper()
	_, dfile, afile := bridgeFiles(t, cl, port)
	return fileConn(t, dfile), fileConn(t, afile)
}

// bridgeFiles makes the allocations "server" on node a (4 vconns) and
// "client" on node b, a bridged listener of a's on port and a bridged
// dial to it from b: the dialling session, and the two sockets the agents
// passed.
func bridgeFiles(t *testing.T, cl *agenttest.Cluster, port uint32) (ds *net.UnixConn, dfile, afile *os.File) {
	t.Helper()
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	sa, err := a.Allocate(ctx, "server", 4)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Allocate(ctx, "client", 4)
	if err != nil {
		t.Fatal(err)
	}
	ls := rawSession(t, sa)
	if f := rawRequest(t, ls, frame.Frame{Op: frame.OpListen, Req: 2, Arg: port, Flags: frame.FlagBridge}); f.Op != frame.OpOK {
		t.Fatalf("listen: %v %s", f.Op, f.Payload)
	}
	ds = rawSession(t, sb)
	req, _ := frame.Append(nil, &frame.Frame{Op: frame.OpDial, Req: 3, Flags: frame.FlagBridge, Payload: []byte(a.Name + ":" + strconv.Itoa(int(port)))})
	if _, err := ds.Write(req); err != nil {
		t.Fatal(err)
	}
	df, dfile := readRights(t, ds)
	if df.Op != frame.OpOK || dfile == nil || df.Handle != 0 {
		t.Fatalf("bridged dial: %v handle %d socket %v: %s", df.Op, df.Handle, dfile != nil, df.Payload)
	}
	af, afile := readRights(t, ls)
	if af.Op != frame.OpAccept || afile == nil || af.Arg != 0 {
		t.Fatalf("bridged accept: %v arg %d socket %v", af.Op, af.Arg, afile != nil)
	}
	return ds, dfile, afile
}

// TestBridgeReadsIntoSendBuffers: the bridge reads the program's bytes
// straight into the engine's send buffers (engine.VConn.SendFrom), a
// message of one chunk each, so the receiving engine hands each on from
// its receive buffer without reassembling it; and a bridge whose program
// writes nothing holds no send buffer while it waits.
func TestBridgeReadsIntoSendBuffers(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 100})
	ea, eb := cl.Nodes[0].Agent.Engine(), cl.Nodes[1].Agent.Engine()
	idle := buffersInUse(eb)
	client, server := bridgePair(t, cl, 7000)
	before := ea.Stats().MsgsReceived

	const size = 1 << 20
	data := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	errc := make(chan error, 1)
	go func() { _, err := client.Write(data); errc <- err }()
	got, err := readN(server, size)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v): differ from those written", len(got), err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// A chunk carries a receive buffer less the header: 16,352 bytes of
	// the default 16 KiB. The bridge used to send a read of up to 64 KiB
	// as one message of four chunks, reassembled (copied) at the peer.
	msgs := ea.Stats().MsgsReceived - before
	if min := uint64(size / (16 << 10)); msgs < min {
		t.Errorf("1 MiB arrived in %d messages: want at least %d, of one chunk each", msgs, min)
	}
	// Idle: the program of the dialling side writes nothing.
	deadline := time.Now().Add(5 * time.Second)
	for held := buffersInUse(eb); held != idle; held = buffersInUse(eb) {
		if time.Now().After(deadline) {
			t.Fatalf("the dialling side's engine holds %d buffers with its bridge idle, %d before it was made", held, idle)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// buffersInUse is the engine's buffers taken, of every class (the
// receive buffers posted included).
func buffersInUse(e *engine.Engine) int {
	n := 0
	for _, k := range e.Stats().BuffersInUse {
		n += k
	}
	return n
}

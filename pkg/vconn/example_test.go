package vconn_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// exampleCluster starts node-a and node-b and returns a client of an
// allocation on each.
func exampleCluster(ctx context.Context) (cl *agenttest.Cluster, a, b *vconn.Client, sockA string) {
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	sockA, err = cl.Nodes[0].Allocate(ctx, "client", 4)
	if err != nil {
		log.Fatal(err)
	}
	sockB, err := cl.Nodes[1].Allocate(ctx, "server", 4)
	if err != nil {
		log.Fatal(err)
	}
	if a, err = vconn.NewClient(ctx, vconn.Options{Socket: sockA}); err != nil {
		log.Fatal(err)
	}
	if b, err = vconn.NewClient(ctx, vconn.Options{Socket: sockB}); err != nil {
		log.Fatal(err)
	}
	return cl, a, b, sockA
}

// A pod dials with the package-level Dial, which reads its allocation's
// socket from RDMAVISOR_SOCKET, and uses the vconn as a net.Conn.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, a, b, sockA := exampleCluster(ctx)
	defer cl.Close()
	defer a.Close()
	defer b.Close()

	// The server, on node-b: a line echo.
	ln, err := b.Listen(ctx, ":7")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "echo: %s", line)
	}()

	// The client, on node-a, as the device plugin set it up.
	os.Setenv(vconn.EnvSocket, sockA)
	c, err := vconn.Dial(ctx, "node-b:7")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "hello over RDMA\n")
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(reply)
	// Output: echo: hello over RDMA
}

// SendMsg and RecvMsg keep message boundaries and carry an immediate.
func ExampleConn_SendMsg() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, a, b, _ := exampleCluster(ctx)
	defer cl.Close()
	defer a.Close()
	defer b.Close()

	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := ln.AcceptVConn()
	if err != nil {
		log.Fatal(err)
	}
	for i, m := range []string{"one", "two", "three"} {
		if err := c.SendMsgImm(ctx, []byte(m), uint32(i)); err != nil {
			log.Fatal(err)
		}
	}
	_ = c.Close()
	for {
		m, err := srv.RecvMsg(ctx)
		if err != nil {
			fmt.Println(err)
			break
		}
		fmt.Printf("%q imm=%d\n", m.Data, m.Imm)
	}
	_ = srv.Close()
	// Output:
	// "one" imm=0
	// "two" imm=1
	// "three" imm=2
	// EOF
}

// The server exports a region to one vconn; the client writes and reads
// it with one-sided operations.
func ExampleConn_Export() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, a, b, _ := exampleCluster(ctx)
	defer cl.Close()
	defer a.Close()
	defer b.Close()

	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	srv, err := ln.AcceptVConn()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	r, err := srv.Export(ctx, 4096, vconn.AccessRead|vconn.AccessWrite)
	if err != nil {
		log.Fatal(err)
	}
	// Tell the client the region's ID in a message (sent after the
	// export, so the export reaches it first).
	if err := srv.SendMsgImm(ctx, nil, r.ID()); err != nil {
		log.Fatal(err)
	}
	m, err := c.RecvMsg(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.WriteRegion(ctx, m.Imm, 100, []byte("written by node-a")); err != nil {
		log.Fatal(err)
	}
	local := make([]byte, 17)
	if err := r.ReadAt(ctx, local, 100); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("node-b's region: %s\n", local)
	if err := r.WriteAt(ctx, []byte("node-b's answer"), 0); err != nil {
		log.Fatal(err)
	}
	back := make([]byte, 15)
	if err := c.ReadRegion(ctx, m.Imm, 0, back); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("node-a read: %s\n", back)
	err = c.WriteRegion(ctx, m.Imm, 4090, make([]byte, 10))
	fmt.Println("out of bounds:", err != nil)
	// Output:
	// node-b's region: written by node-a
	// node-a read: node-b's answer
	// out of bounds: true
}

package clib_test

import (
	"strings"
	"testing"
)

// TestCRecvFn runs test/test_recvfn.c against node-a and node-b, on
// shared memory and on the socket: vconn_recv_fn hands fn each message
// byte for byte; on shared memory in place in ring RX's slab, released
// after fn (more messages than the ring holds pass), with no allocation
// per message; fn's error, the waits and EOF come back as vconn_recv's.
func TestCRecvFn(t *testing.T) {
	for _, mode := range []string{"shm", "socket"} {
		t.Run(mode, func(t *testing.T) {
			cl := cluster(t)
			a := allocate(t, cl.Nodes[0], "fn-a", 4)
			b := allocate(t, cl.Nodes[1], "fn-b", 4)
			shmOn := "0"
			if mode == "shm" {
				shmOn = "1"
			}
			out := runC(t, "test_recvfn", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name,
				"VCONN_PORT=7008", "VCONN_SHM="+shmOn)
			if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
				t.Fatal("test_recvfn did not finish")
			}
		})
	}
}

package clib_test

import (
	"strings"
	"testing"
)

// TestCShmCopy runs test/test_shmcopy.c against node-a and node-b, on
// shared memory and, to compare, on the socket: vconn_recv and vconn_read
// byte for byte with buffers exact, larger and shorter than the messages,
// and, on shared memory, no allocation per message received (libvconn
// copies each once, from ring RX's slab into the caller's buffer).
func TestCShmCopy(t *testing.T) {
	for _, mode := range []string{"shm", "socket"} {
		t.Run(mode, func(t *testing.T) {
			cl := cluster(t)
			a := allocate(t, cl.Nodes[0], "cp-a", 4)
			b := allocate(t, cl.Nodes[1], "cp-b", 4)
			shmOn := "0"
			if mode == "shm" {
				shmOn = "1"
			}
			out := runC(t, "test_shmcopy", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name,
				"VCONN_PORT=7007", "VCONN_SHM="+shmOn)
			if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
				t.Fatal("test_shmcopy did not finish")
			}
		})
	}
}

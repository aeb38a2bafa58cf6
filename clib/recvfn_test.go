package clib_test

import "testing"

// TestCRecvFn runs test/test_recvfn.c against node-a and node-b, on
// shared memory and on the socket: vconn_recv_fn hands fn each message
// byte for byte; on shared memory in place in ring RX's slab, released
// after fn (more messages than the ring holds pass), with no allocation
// per message; fn's error, the waits and EOF come back as vconn_recv's.
func TestCRecvFn(t *testing.T) { runOnAgents(t, "test_recvfn", "fn", 4, 7008, nil) }

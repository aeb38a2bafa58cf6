package clib_test

import "testing"

// TestCShmCopy runs test/test_shmcopy.c against node-a and node-b, on
// shared memory and, to compare, on the socket: vconn_recv and vconn_read
// byte for byte with buffers exact, larger and shorter than the messages,
// and, on shared memory, no allocation per message received (libvconn
// copies each once, from ring RX's slab into the caller's buffer).
func TestCShmCopy(t *testing.T) { runOnAgents(t, "test_shmcopy", "cp", 4, 7007, nil) }

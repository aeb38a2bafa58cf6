// Package wire carries the software RDMA provider's packets between soft
// devices: the UDP payload of a RoCEv2 packet (BTH through ICRC), addressed by
// the destination device's GID.
//
// It owns three things:
//   - UDP (ListenUDP): one socket per device, every device of a network on
//     the same port as RoCEv2 does (default 4791), batched with
//     sendmmsg/recvmmsg and, where the kernel has them, UDP segmentation
//     offload and GRO; Don't-Fragment set so the path MTU is honoured.
//   - Fabric (NewFabric): an in-memory network for deterministic tests, with
//     a bounded receive queue per endpoint.
//   - Faults (and WithFaults): seeded loss, duplication, reordering, delay and
//     jitter, applied by the fabric and, as a decorator, by any Wire. One
//     implementation serves both.
//
// Buffers: Packet.Buf always belongs to the caller. Send reads it only until
// it returns; Recv writes it only until it returns. The fabric and the fault
// model copy what they keep into buffers from their own bounded pools.
//
// Losses are counted, never returned as errors: a packet dropped by the
// network (fault, full queue, unknown destination, too large, truncated) is
// counted in Stats and Send still reports it as consumed. An error from Send
// or Recv means the wire is closed (errors.Is(err, net.ErrClosed)) or broken.
package wire

// Package vconn is the RDMAvisor client SDK: applications in a pod open
// vconns, logical RDMA connections that the node agent multiplexes over a
// few shared queue pairs per peer node.
//
// Dial and Listen return a net.Conn and a net.Listener, so gRPC
// (grpc.WithContextDialer) and net/http (http.Serve, Transport.DialContext)
// run over RDMAvisor unchanged. Addresses are "node:port", node being a
// peer's node name or IP. A Conn is also message-oriented: SendMsg and
// RecvMsg keep boundaries and carry an optional immediate; and one-sided:
// Export a region to the peer vconn, which may then WriteRegion and
// ReadRegion it without the exporting application's involvement.
//
// What a vconn carries depends on its transport, which the RDMAService
// sets for the node (Conn.Transport): rc and auto are reliable, so Read
// and Write are a byte stream and SendMsg takes up to MaxMessage bytes;
// uc and ud may lose messages, so Read and Write fail with ErrNotStream and
// only messages work, up to what one such message carries
// (Conn.MaxMessage: on ud, one MTU less a header).
//
// The package-level functions use the allocation the device plugin gave
// the pod ($RDMAVISOR_SOCKET, $RDMAVISOR_VCONNS); a Client takes explicit
// Options. The agent enforces the allocation's quota: a Dial beyond it
// fails with ErrQuota; closing a vconn frees its slot. If the agent
// restarts, open vconns fail with ErrAgentGone and the next call
// reconnects.
//
// Data crosses the unix socket to the agent by copy; a shared-memory fast
// path (memfd rings registered once by the agent) is future work.
package vconn

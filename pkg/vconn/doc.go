// Package vconn is the RDMAvisor client SDK: applications in a pod open
// vconns, logical RDMA connections that the node agent multiplexes over a
// few shared queue pairs per peer node.
//
// Dial and Listen return a net.Conn and a net.Listener, so gRPC
// (grpc.WithContextDialer) and net/http (http.Serve, Transport.DialContext)
// run over RDMAvisor unchanged. A Conn is also message-oriented: SendMsg and
// RecvMsg keep boundaries and carry an optional immediate (RecvMsgFunc
// hands a message to a function in place, on shared memory without a
// copy in the pod); and one-sided:
// Export a region to the peer vconn, which may then WriteRegion and
// ReadRegion it without the exporting application's involvement.
//
// # Addresses
//
// A vconn address names a pod and a port, as a TCP address does: each pod
// has its own port space. Listen(ctx, ":7000") listens on port 7000 of
// the pod's own IP (Listener.Addr says which, "10.244.1.5:7000"); another
// pod's listener on 7000 is no conflict, and no pod can listen on, learn
// of or receive another's ports. Dial takes:
//
//   - a pod IP and port, "10.244.1.5:7000": that pod's listener, on
//     whichever node serves the pod (agents announce their pods' IPs to
//     each other);
//   - a name, "echo.default.svc:7000": resolved with Options.Resolver
//     (default net.DefaultResolver, the cluster's DNS in a pod) to IPs,
//     dialed in turn until one answers. A headless Service
//     (clusterIP: None) resolves to its ready pods' IPs; a ClusterIP is
//     no pod's and is unreachable over vconns, so a vconn server's
//     Service must be headless. gRPC's own resolver works too:
//     grpc.NewClient("dns:///echo.default.svc:7000",
//     grpc.WithContextDialer(...)) hands the dialer pod IPs;
//   - a node's name or IP, "node-b:7000": the node's host services, the
//     port space of allocations made for no pod (standalone agents
//     without Kubernetes, rdmavisor demo, tests). A pod never listens
//     there. Node names come before DNS: the agent knows them.
//
// A pod's first Listen or Dial may wait a few seconds for the agent to
// learn the pod (its IP from the CNI plugin, its allocation from the
// device plugin), and fails with ErrNoAddress if it does not; a hostNetwork
// pod has no address of its own and cannot listen. An accepted vconn's
// RemoteAddr is the dialing pod's IP with port 0 ("node:0" for a host
// service).
//
// # Transports
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
// Data crosses the unix socket to the agent by copy, or, with
// Options.SharedMemory, rings in a memfd the agent shares with the pod
// (package shm), where doorbells ring only for a side that sleeps. An
// exported Region is, where the agent offers it, a memfd the agent
// registered and the pod maps: its ReadAt and WriteAt are memory copies,
// and the peer's RDMA reaches the same pages. WriteRegion and ReadRegion
// likewise copy their bytes into or out of the vconn's staging memory,
// which the agent registered, and send the agent only where they are.
package vconn

// Package admin is the node agent's admin API: the requests and replies of
// the admin socket, the allocations and pods they carry, the agent's
// status, and the Client that the device plugin, the CNI plugin and the
// CLI use. It imports nothing of the data plane (no engine, no verbs, no
// gRPC), so the CNI plugin's binary does not link it; package agent serves
// this API.
//
// The admin socket (the agent configuration's adminSocket,
// SOCK_SEQPACKET, mode 0600) is for the node's components only. One
// request per datagram, one reply per request, both JSON (Request, Reply),
// at most MaxMessage bytes, with "version": Version:
//
//	op                request fields     reply fields
//	status            -                  status {ready, node, capacity, allocated, vconns, qps, peers}
//	createAllocation  allocation {id, vconns}  allocation {id, vconns, socket, inUse}
//	deleteAllocation  id                 -
//	listAllocations   -                  allocations
//	registerPod       pod {uid, namespace, name, ips, netns, containerID}  -
//	unregisterPod     id (the pod UID)   -   (unknown pods are not an error)
//	listPods          -                  pods
//
// A failed request has "error" and "code" (CodeInvalid, CodeExists,
// CodeNotFound, CodeQuota, CodeVersion, CodeMalformed); a malformed
// request is answered, then the connection is closed. The Client returns
// a failure as *Error, which matches ErrExists, ErrNotFound and ErrQuota
// with errors.Is.
package admin

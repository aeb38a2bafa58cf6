// Package shm is the shared-memory data path between a pod and its node
// agent (DESIGN.md §3, pod ↔ agent): a memfd holding two single-producer,
// single-consumer rings of fixed-size descriptors with their payload slabs,
// and socketpair doorbells rung only when the other side announced it sleeps.
//
// The agent creates a Segment (it sizes and seals the memfd, so the pod
// cannot shrink it under the agent's mapping), passes its descriptors to
// the pod over the allocation's socket with SCM_RIGHTS, and the pod maps
// it with Open. Ring TX carries the pod's messages to the agent, ring RX
// the agent's deliveries to the pod.
//
// Trust: everything in shared memory can be rewritten by the pod at any
// time. Each endpoint keeps its own indices privately and only publishes
// them; every index and length it reads from the other side is checked
// before use (ErrCorrupt), and every descriptor is copied out once before
// it is checked, so the agent never reads outside the mapping whatever the
// pod writes.
package shm

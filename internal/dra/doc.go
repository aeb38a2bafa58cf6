// Package dra is RDMAvisor's Dynamic Resource Allocation driver (the
// kubelet plugin of k8s.io/dynamic-resource-allocation): the Kubernetes
// native way into the node agent, beside the device plugin.
//
// # Devices
//
// The driver publishes one ResourceSlice pool per node, named after the
// node, with one device per RDMA endpoint the agent serves (Endpoints:
// one per rail; an agent serving several rails, multi-rail, splits its
// quota evenly over them). A device allows multiple allocations and has a
// consumable "vconns" capacity, the agent's quota (its share), of which a
// request consumes 1 unless it asks for more. Its attributes, for CEL
// selectors: transport (RoCE, InfiniBand, or UDP for the soft provider),
// linkLayer, deviceName, gid, rail, numaNode and pciRoot (where sysfs
// knows them, with the standard resource.kubernetes.io/numaNode, pcieRoot
// and pciBusID too) and version. A claim's allocation is bound to the rail
// of its first device (recorded in its CDI spec for restores).
//
// # Health
//
// Every device is reported Healthy to the kubelet while the agent is
// ready and its rail up, and Unhealthy, with why, while it is not (pods
// that hold it see that in their resource health status). A rail the
// agent reports down (admin.Rail.Down: port not ACTIVE, device gone) is
// also withdrawn from the published ResourceSlice until it is up again,
// so that the scheduler allocates no new claim on it whatever the
// cluster's feature gates (ResourceSlice device taints are gated); a
// claim allocated on it before is refused at prepare with the rail and
// the reason, and a lost allocation on it is re-created once it is up.
//
// # Prepare and unprepare
//
// A prepared claim gets an agent allocation exactly as a device-plugin
// container does (the same admin socket): id "dra-" and 32 hex digits of
// HMAC-SHA256 of the claim's UID keyed by a node-local secret
// (deviceplugin.KeyedID, as the device plugin's ids are; the UID is for
// anyone who may read the claim, and an id is a capability on the
// allocation's socket path), quota the vconns its results consume
// together, bound to the claim's one pod. (A
// container has one socket directory: several requests of a claim, or an
// extended resource's count, add up to one quota; a pod should use one
// claim of the class.) The container gets it by CDI (package cdispec,
// kind rdmavisor.io/claim): the allocation's directory mounted read-only
// and RDMAVISOR_SOCKET, RDMAVISOR_VCONNS. Unprepare deletes the
// allocations and the specs. Both are idempotent, as the kubelet retries
// them.
//
// # Restarts
//
// The CDI specs are the driver's record of what it prepared (their
// annotations keep each allocation's pod and quota): every SyncInterval
// the driver re-creates the allocations a restarted agent lost, and
// deletes the "dra-" allocations no spec records (a driver killed in the
// middle of a prepare). A restarted kubelet prepares or unprepares again;
// a restarted driver reads its specs. The secret is made once, mode 0600,
// in Options.KeyFile (the command's default: allocation-id.key in the
// kubelet's plugin directory of the driver, on the host's disk) and read
// back at every start, so that a restarted driver gives a claim the same
// id; Unprepare also removes the "dra-<claim uid>" allocation an older
// driver made.
package dra

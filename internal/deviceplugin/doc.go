// Package deviceplugin is RDMAvisor's kubelet device plugin (API
// v1beta1): it advertises the node's vconns as an extended resource
// (config resourceName, default rdmavisor.io/vconn) and turns each
// container's share of it into an allocation of the node agent.
//
// # Devices
//
// The plugin advertises vconnsPerNode devices, vconn-0000, vconn-0001...
// A device is one vconn of quota, not a piece of hardware: the devices of
// a container together become one agent allocation of k vconns. Their
// health is the agent's: the plugin polls the agent's admin socket
// (Options.HealthInterval, and at once when the admin socket is created
// again) and every device is Unhealthy while the agent does not answer or
// reports not ready (its RDMA device is down), and Healthy again once it
// does. The devices of a rail the agent reports down (admin.Rail.Down: its
// port is not ACTIVE, or the device is gone) are Unhealthy while it is,
// the other rails' staying Healthy; each such change is logged with the
// agent's reason. ListAndWatch streams every change.
//
// # Allocate
//
// Allocate creates, per container, an allocation whose id is derived from
// the sorted device IDs (AllocationID: "dp-" and an HMAC-SHA256 keyed by
// the node's secret Key, in <stateDir>/allocation-id.key, made once and
// kept across restarts and reboots), with a quota of
// as many vconns as devices. A retried Allocate for the same devices finds
// the allocation already there and returns the same answer. The container
// gets the allocation's directory, <socketDir>/alloc/<id> on the host,
// mounted at ContainerSocketDir, and RDMAVISOR_SOCKET and RDMAVISOR_VCONNS.
// With CDI enabled (Options.CDI) it also gets a CDI device
// "<resourceName>=<id>", whose spec Allocate writes first (package
// cdispec, in Options.CDISpecDir) with the same mount and environment:
// the response keeps both, because a runtime without CDI (containerd
// before 1.7, as Debian 12 ships) ignores the device. Collection removes
// the spec with its allocation, and writes again a kept allocation's
// spec that is missing. Unknown, duplicate or too many device IDs
// are codes.InvalidArgument and allocate nothing.
//
// # Topology and preferred allocation
//
// Options.Rails are the RDMA devices that may serve the vconns (Rails
// reads them from sysfs with package rdmadev). The advertised devices
// carry, in TopologyInfo, the NUMA node of the one the agent serves them
// with (known at once with one rail, else once the agent's status names
// its device; the streams are sent again then), so that the kubelet's
// Topology Manager can align a pod's CPUs with its NIC. The soft
// provider, and a device whose NUMA node is unknown, report no topology.
// An agent that serves several rails (multi-rail; its status lists them)
// serves the advertised devices in contiguous blocks, one a rail, each
// with its rail's NUMA node, and Allocate binds each allocation to the
// rail of most of its devices (admin.RailAgent), so a container the preferred
// allocation kept on one NUMA node uses that node's NIC. A rail that is
// down is never chosen when one of the container's devices is on a rail
// that is up; given only devices of a rail that is down (the kubelet had
// not yet had their Unhealthy), Allocate fails with the agent's refusal
// and the rail's reason.
//
// GetPreferredAllocation prefers, deterministically, the must-include
// devices, then the lowest-starting run of contiguous available devices
// long enough for the rest, else the lowest IDs; with a topology it does
// so on one NUMA node: the must-include devices' node, else the node with
// the fewest available devices that fits the whole request (best fit),
// and only what that node cannot give comes from the others. It never
// prefers a device of a rail that is down.
//
// # Registration and kubelet restarts
//
// The plugin serves its socket in the kubelet's device-plugin directory,
// dials it to prove it serves, and only then registers with the kubelet.
// Each registration serves a socket of its own (resource name, pid, start
// time, count): a kubelet keys plugins by resource and socket, and two
// registrations at one socket close together confused it for good. At
// start the plugin removes the sockets earlier ones left (only names its
// versions give their sockets, never another plugin's), and at each new
// registration and at exit its last. It serves only resources of the
// rdmavisor.io domain (ResourceDomain): the kubelet hands a resource to the
// last plugin that registers it, so serving another vendor's would take it
// over.
// It watches the directory (fsnotify): when kubelet.sock is created again
// (the kubelet restarted) or the plugin's own socket is removed, it stops
// its server and starts over; a failed registration is retried every
// Options.RetryInterval.
//
// # Garbage collection
//
// Every Options.GCInterval, and at start, the plugin lists the agent's
// allocations whose ids start with "dp-" (those the device plugin made)
// and the pods' devices through the kubelet pod-resources API, and deletes
// the allocations no container holds any more: no quota leaks across pod
// deletions, kubelet restarts or plugin restarts. An allocation this
// process created less than Options.GCGrace ago is kept, because the
// kubelet records a container's devices only after Allocate returns. When
// the pod-resources API does not answer nothing is deleted.
//
// The same pass re-creates the allocations of running containers that the
// agent does not have (a restarted agent keeps none); it runs at once when
// the agent's admin socket reappears or the devices turn healthy. The
// allocation comes back at the same host path; a container sees it only
// if the directory it mounted was not removed in between.
//
// The pod-resources API lists the containers of pod.spec.containers (and
// sidecars), not ordinary init containers: an init container that runs
// longer than GCGrace loses its allocation. When an app container gets
// exactly the devices of an init container (the kubelet reuses them), both
// share one allocation.
package deviceplugin

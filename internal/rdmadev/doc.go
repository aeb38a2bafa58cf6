// Package rdmadev lists a node's RDMA devices without libibverbs: from
// sysfs (/sys/class/infiniband) and the kernel's RDMA netlink family. It
// reports what scheduling needs and what the operator shows even where no
// agent has opened a device: each device's ports, their link layer,
// state, LID and GID table (with each GID's type and network device), the
// node GUID, the network devices, and where the device sits: its PCI
// address, PCI root and NUMA node.
//
// Every function takes the sysfs root ("/sys" on a node, a fake tree in
// tests: see package rdmadevtest). A file that does not parse is a
// *FileError naming the file; one a kernel or provider may lack (the NUMA
// node, the PCI device of a software device such as rxe) is reported
// unknown instead.
package rdmadev

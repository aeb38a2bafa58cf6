// Package controllers holds the RDMAvisor operator's reconcilers. The
// RDMAService reconciler renders, per RDMAService, the node agent DaemonSet
// (agent, device plugin, CNI installer), its ConfigMap, ServiceAccount, RBAC
// and the admission policy that confines each agent to its own RDMANode; it
// resolves conflicts between services that claim the same nodes, and
// aggregates the agents' RDMANodes into the service's status.
package controllers

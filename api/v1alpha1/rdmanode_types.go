package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeviceHealth is what an agent last observed of a device.
// +kubebuilder:validation:Enum=Healthy;Unhealthy
type DeviceHealth string

const (
	// DeviceHealthy: the device is usable.
	DeviceHealthy DeviceHealth = "Healthy"
	// DeviceUnhealthy: the device failed (port down, fatal async event, ...).
	DeviceUnhealthy DeviceHealth = "Unhealthy"
)

// ConditionNodeReady is the condition type an agent sets on its RDMANode:
// True when it serves pods and peers.
const ConditionNodeReady = "Ready"

// ConditionPeersReachable is the condition type an agent sets on its
// RDMANode: False, naming them, while peer agents it talked to stop
// answering its heartbeats (their nodes lost, frozen or cut off).
const ConditionPeersReachable = "PeersReachable"

// ConditionDeviceReady is the condition type an agent sets on its
// RDMANode: whether it has its RDMA device open, and if not, why; the
// operator reports the nodes whose device is not ready in the
// RDMAService's Degraded.
const ConditionDeviceReady = "DeviceReady"

// RDMADevice is one RDMA device an agent uses.
type RDMADevice struct {
	// Name of the device (mlx5_0, or the soft provider's name).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Name string `json:"name"`

	// Vendor as the provider reports it.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Vendor string `json:"vendor,omitempty"`

	// Provider that drives the device.
	Provider Provider `json:"provider"`

	// GID the agent uses on the device, written as an IP address, as
	// verbs.GID.String does: IPv6 notation, except that an IPv4-mapped GID
	// (RoCEv2 on an IPv4 address) is written as the IPv4 address.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="gid must be written as an IP address (an IPv4-mapped GID as its IPv4 address)"
	// +optional
	GID string `json:"gid,omitempty"`

	// NUMANode the device is attached to; -1 when unknown.
	// +kubebuilder:validation:Minimum=-1
	// +optional
	NUMANode *int32 `json:"numaNode,omitempty"`

	// Health of the device.
	Health DeviceHealth `json:"health"`

	// Message says why the device is unhealthy.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`

	// Rail is the device's index among the agent's devices (multi-rail,
	// an engine each): allocations bound to it reach the other nodes'
	// devices of the same rail.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Rail int32 `json:"rail,omitempty"`

	// VConnsAllocated is the vconns of the allocations bound to the
	// device: its share of the node's vconnCapacity.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VConnsAllocated int32 `json:"vconnsAllocated,omitempty"`

	// VConnsOpen is the number of vconns open on the device.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VConnsOpen int32 `json:"vconnsOpen,omitempty"`

	// QPsInUse is the number of queue pairs the agent holds on the device.
	// +kubebuilder:validation:Minimum=0
	// +optional
	QPsInUse int32 `json:"qpsInUse,omitempty"`
}

// AgentAddress is where peer agents reach this node's agent.
type AgentAddress struct {
	// IP of the node (the agent runs on the host network).
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="ip must be an IP address"
	IP string `json:"ip"`

	// ControlPort is the agent-to-agent gRPC port.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ControlPort int32 `json:"controlPort"`
}

// RDMANodeSpec says which RDMAService's agent owns this node.
type RDMANodeSpec struct {
	// ServiceName is the RDMAService whose agent writes this object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="serviceName is immutable"
	ServiceName string `json:"serviceName"`
}

// RDMANodeStatus is what the agent reports of its node.
// +kubebuilder:validation:XValidation:rule="!has(self.vconnsOpen) || !has(self.vconnCapacity) || self.vconnsOpen <= self.vconnCapacity",message="vconnsOpen cannot exceed vconnCapacity"
type RDMANodeStatus struct {
	// Conditions: Ready, DeviceReady, PeersReachable.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Devices the agent uses.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Devices []RDMADevice `json:"devices,omitempty"`

	// QPsInUse is the number of queue pairs the agent holds.
	// +kubebuilder:validation:Minimum=0
	// +optional
	QPsInUse int32 `json:"qpsInUse,omitempty"`

	// VConnsAllocated is the sum of the quotas of the allocations bound
	// on the node (pods holding vconns, whether or not they opened them).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	// +optional
	VConnsAllocated int32 `json:"vconnsAllocated"`

	// VConnsOpen is the number of vconns open on the node.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	// +optional
	VConnsOpen int32 `json:"vconnsOpen"`

	// VConnCapacity is the number of vconns the node offers to pods.
	// +kubebuilder:validation:Minimum=0
	// +optional
	VConnCapacity int32 `json:"vconnCapacity,omitempty"`

	// Address where peer agents reach this agent.
	// +optional
	Address *AgentAddress `json:"address,omitempty"`

	// HeartbeatTime is when the agent last wrote this status. The operator
	// counts a node whose heartbeat is too old as not ready.
	// +optional
	HeartbeatTime *metav1.Time `json:"heartbeatTime,omitempty"`

	// UnreachablePeers are the nodes whose agents stopped answering this
	// agent's heartbeats: their vconns with this node failed. A node comes
	// off the list when its agent answers again.
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	UnreachablePeers []string `json:"unreachablePeers,omitempty"`
}

// RDMANode is one node's RDMAvisor agent, as the agent reports it. Its name is
// the node's name; the agent may write only its own (a ValidatingAdmissionPolicy
// rendered by the operator enforces it).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,categories=rdmavisor
// +kubebuilder:selectablefield:JSONPath=`.spec.serviceName`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.status.devices[0].provider`
// +kubebuilder:printcolumn:name="Devices",type=string,JSONPath=`.status.devices[*].name`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.vconnsAllocated`,description="vconns allocated to pods"
// +kubebuilder:printcolumn:name="Open",type=integer,JSONPath=`.status.vconnsOpen`,description="vconns open"
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.status.vconnCapacity`,priority=1
// +kubebuilder:printcolumn:name="QPs",type=integer,JSONPath=`.status.qpsInUse`,description="queue pairs in use"
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address.ip`
// +kubebuilder:printcolumn:name="Port",type=integer,JSONPath=`.status.address.controlPort`,priority=1
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.spec.serviceName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RDMANode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec RDMANodeSpec `json:"spec"`
	// +optional
	Status RDMANodeStatus `json:"status,omitempty"`
}

// RDMANodeList is a list of RDMANodes.
//
// +kubebuilder:object:root=true
type RDMANodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RDMANode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RDMANode{}, &RDMANodeList{})
}

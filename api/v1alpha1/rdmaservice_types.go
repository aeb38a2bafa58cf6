package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Provider names the verbs backend a node agent drives.
// +kubebuilder:validation:Enum=soft;ibverbs
type Provider string

const (
	// ProviderSoft is the pure-Go RoCEv2 provider: no RDMA hardware needed.
	ProviderSoft Provider = "soft"
	// ProviderIBVerbs is libibverbs on real RDMA devices.
	ProviderIBVerbs Provider = "ibverbs"
)

// Transport is the policy that picks the queue pair type a message travels on.
// +kubebuilder:validation:Enum=rc;uc;ud;auto
type Transport string

const (
	// TransportRC sends everything over reliable-connected QPs.
	TransportRC Transport = "rc"
	// TransportUC sends everything over unreliable-connected QPs: in
	// order, but a lost message is lost whole; messages of at most one
	// receive buffer (16 KiB less a header).
	TransportUC Transport = "uc"
	// TransportUD sends everything over unreliable-datagram QPs: messages
	// of at most one MTU less a header, which may be lost or reordered.
	TransportUD Transport = "ud"
	// TransportAuto is reliable and ordered like rc: messages of up to a
	// receive buffer go as datagrams with the agent's own acknowledgements
	// and retransmission, longer ones over rc.
	TransportAuto Transport = "auto"
)

// Allocation is how pods get vconns on a service's nodes.
// +kubebuilder:validation:Enum=DevicePlugin;DRA;Both
type Allocation string

const (
	// AllocationDevicePlugin: the device plugin advertises ResourceName, an
	// extended resource pods request in resources.limits.
	AllocationDevicePlugin Allocation = "DevicePlugin"
	// AllocationDRA: the DRA driver publishes each node's RDMA endpoints in
	// ResourceSlices with a consumable vconns capacity, which
	// ResourceClaims take; no device plugin runs.
	AllocationDRA Allocation = "DRA"
	// AllocationBoth runs both; they share each agent's vconns.
	AllocationBoth Allocation = "Both"
)

// Defaults and bounds of RDMAService fields. The kubebuilder markers below
// repeat them as literals (markers cannot reference constants); a test checks
// the generated schema against these values, and these against the agent's
// (DefaultQPsPerPeer, MaxQPsPerPeer and the Transport names are defined once
// in internal/transport, which this package may not import).
const (
	DefaultResourceName   = "rdmavisor.io/vconn"
	DefaultQPsPerPeer     = 2
	MaxQPsPerPeer         = 64
	DefaultVConnsPerNode  = 1024
	MaxVConnsPerNode      = 65536
	DefaultBufferPoolSize = "64Mi"
	MinBufferPoolSize     = "1Mi"
	MaxBufferPoolSize     = "64Gi"
	// MaxServiceNameLength keeps the names derived from an RDMAService
	// ("rdmavisor-agent-" + name) within the 63 characters of a label value.
	MaxServiceNameLength = 40
	// MaxSocketGroup is the largest group id a pod's
	// securityContext.supplementalGroups may hold.
	MaxSocketGroup = 2147483647
	// ResourceDomain is the only domain of resourceName: the device plugin
	// of a service takes over whatever resource it names on its nodes (the
	// kubelet hands the resource to the last plugin that registers it), so a
	// service may name only resources of RDMAvisor's own domain.
	ResourceDomain = "rdmavisor.io"
	// MaxAgentCPURequest and MaxAgentMemoryRequest bound what an agent pod
	// reserves on its node: it runs at priority system-node-critical, so
	// the scheduler preempts tenant pods to fit what it requests. Limits
	// (which preempt nothing, and size the agent's pollers) are not bounded,
	// but a limit set without a request is the request too.
	MaxAgentCPURequest    = "4"
	MaxAgentMemoryRequest = "8Gi"
)

// Bounds of spec.limits: the agent configuration's (internal/config's
// Max* and Min* limits), which a test holds these to.
const (
	MaxSessions       = 4096
	MaxListeners      = 65535
	MaxRegions        = 1 << 20
	MinRegionSize     = "1"
	MaxRegionSize     = "64Gi"
	MinQueuedSize     = "64Ki"
	MaxQueuedSize     = "16Gi"
	MinRegisteredSize = "1"
	MaxRegisteredSize = "1Ti"
	MaxMessageRate    = 100000000
	MaxByteRate       = "1Ti"
)

// Condition types of an RDMAService.
const (
	// ConditionReady is True when every node the service deploys to runs an
	// agent that reports ready.
	ConditionReady = "Ready"
	// ConditionProgressing is True while selected nodes have not yet
	// reported ready.
	ConditionProgressing = "Progressing"
	// ConditionDegraded is True when a node reports unhealthy.
	ConditionDegraded = "Degraded"
	// ConditionConflict is True when an older RDMAService already claims
	// some of the nodes this one selects.
	ConditionConflict = "Conflict"
)

// DeviceSelector chooses the RDMA devices an agent uses on its node.
// +kubebuilder:validation:XValidation:rule="!has(self.provider) || self.provider != 'soft' || (!has(self.names) && !has(self.vendors))",message="names and vendors select hardware devices: they cannot be set with provider soft"
// +kubebuilder:validation:XValidation:rule="!has(self.rails) || self.rails <= 1 || ((!has(self.provider) || self.provider == 'ibverbs') && has(self.names) && size(self.names) >= self.rails)",message="more than one rail needs provider ibverbs and as many names, one a rail, in order (the soft provider's rail addresses differ per node: set them in a standalone agent's configuration)"
type DeviceSelector struct {
	// Provider is the verbs backend: ibverbs for RDMA hardware, soft for the
	// software provider (RoCEv2 over UDP, no hardware needed).
	// +kubebuilder:default=ibverbs
	// +optional
	Provider Provider `json:"provider,omitempty"`

	// Names of the devices to use, as ibv_devices lists them (mlx5_0).
	// Empty: every device whose vendor matches.
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.-]*$`
	// +optional
	Names []string `json:"names,omitempty"`

	// Vendors of the devices to use, as the provider reports them (a name
	// such as mellanox, or a vendor ID such as 0x02c9), compared without
	// case. Empty: any vendor.
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.-]*$`
	// +optional
	Vendors []string `json:"vendors,omitempty"`

	// Rails is how many devices each agent serves, an engine each
	// (multi-rail): the first Rails of Names, in order. Rail i of a node
	// talks only to rail i of another, as rail-optimised fabrics are
	// wired; an allocation is bound to one rail (by the NUMA node the
	// device plugin places it on, or the device a DRA claim was given).
	// Absent or 1: one device, the first the selector accepts.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	// +optional
	Rails int32 `json:"rails,omitempty"`
}

// Limits bound what each allocation (a pod's share of a node's vconns)
// may hold of its node's agent, so that one tenant cannot exhaust the
// agent for the others, and registeredSize what all of them together may.
// A request past a limit fails with the limit's name (the SDK's
// ErrLimit), except the rates, which slow the pod's sends instead. Every
// field is optional: absent, the agent's default. Sizes are quantities of
// bytes, as bufferPoolSize is; they become the agent configuration's
// limits.regionBytes, queuedBytes, registeredBytes and byteRate.
type Limits struct {
	// Sessions: connections to an allocation's socket at once. Absent: 64.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4096
	// +optional
	Sessions *int32 `json:"sessions,omitempty"`

	// Listeners: ports an allocation listens on at once. Absent: 256.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Listeners *int32 `json:"listeners,omitempty"`

	// Regions: regions an allocation has exported at once, each counted
	// until its memory is deregistered. Absent: 1024.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	// +optional
	Regions *int32 `json:"regions,omitempty"`

	// RegionSize: the memory an allocation's regions and staging memory
	// register, between 1 and 64Gi. Absent: 1Gi.
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('1')) >= 0 && quantity(string(self)).compareTo(quantity('64Gi')) <= 0",message="regionSize must be a whole number of bytes between 1 and 64Gi"
	// +optional
	RegionSize *resource.Quantity `json:"regionSize,omitempty"`

	// QueuedSize: message bytes the agent holds for an allocation in each
	// direction (received and not yet taken by the pod; sent and not yet
	// taken by the engine), between 64Ki (the largest message the agent
	// hands over) and 16Gi. Absent: 64Mi.
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('64Ki')) >= 0 && quantity(string(self)).compareTo(quantity('16Gi')) <= 0",message="queuedSize must be a whole number of bytes between 64Ki and 16Gi"
	// +optional
	QueuedSize *resource.Quantity `json:"queuedSize,omitempty"`

	// RegisteredSize: the memory the regions of all a node's allocations
	// together register (pinned, with ibverbs), between 1 and 1Ti. Shared
	// fairly: an allocation may hold at most registeredSize divided by
	// the allocations holding registered memory, itself included. Absent:
	// 4Gi.
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('1')) >= 0 && quantity(string(self)).compareTo(quantity('1Ti')) <= 0",message="registeredSize must be a whole number of bytes between 1 and 1Ti"
	// +optional
	RegisteredSize *resource.Quantity `json:"registeredSize,omitempty"`

	// MessageRate: messages a second an allocation may send, over all its
	// vconns; past it its sends wait (a burst of a tenth of a second's
	// worth goes at once). 0 or absent: unlimited.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000000
	// +optional
	MessageRate *int32 `json:"messageRate,omitempty"`

	// ByteRate: bytes a second an allocation may send in messages, over
	// all its vconns (a quantity such as 100Mi), up to 1Ti; past it its
	// sends wait. 0 or absent: unlimited.
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('0')) >= 0 && quantity(string(self)).compareTo(quantity('1Ti')) <= 0",message="byteRate must be a whole number of bytes a second between 0 (unlimited) and 1Ti"
	// +optional
	ByteRate *resource.Quantity `json:"byteRate,omitempty"`
}

// AgentSpec configures the pods of the node agent DaemonSet. One image holds
// the node agent, the device plugin and the CNI installer.
type AgentSpec struct {
	// Image of the node agent. Empty: the operator's default image.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// ImagePullPolicy of the agent containers.
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Resources of the node agent container. Its CPU limit sets how many
	// pollers the agent runs: one per whole CPU (each keeps a core busy
	// under load); without a limit, one per CPU Go's GOMAXPROCS gives it.
	// Only cpu and memory, and at most 4 CPUs and 8Gi requested (a limit
	// without a request counts as the request): the agent runs at priority
	// system-node-critical, and the scheduler preempts tenant pods to fit
	// what it requests. Limits may be higher.
	// +kubebuilder:validation:XValidation:rule="(!has(self.requests) || size(self.requests) == ('cpu' in self.requests ? 1 : 0) + ('memory' in self.requests ? 1 : 0)) && (!has(self.limits) || size(self.limits) == ('cpu' in self.limits ? 1 : 0) + ('memory' in self.limits ? 1 : 0)) && (!has(self.claims) || size(self.claims) == 0)",message="agent resources may name cpu and memory only: the agent uses nothing else, and at its priority a request for another resource would preempt the tenant pods holding it"
	// +kubebuilder:validation:XValidation:rule="has(self.requests) && 'cpu' in self.requests ? isQuantity(string(self.requests['cpu'])) && quantity(string(self.requests['cpu'])).compareTo(quantity('4')) <= 0 : !has(self.limits) || !('cpu' in self.limits) || isQuantity(string(self.limits['cpu'])) && quantity(string(self.limits['cpu'])).compareTo(quantity('4')) <= 0",message="the agent may request at most 4 CPUs (a limit without a request is the request): it runs at priority system-node-critical, and the scheduler preempts tenant pods to fit its request; set a higher limit with a request for more pollers"
	// +kubebuilder:validation:XValidation:rule="has(self.requests) && 'memory' in self.requests ? isQuantity(string(self.requests['memory'])) && quantity(string(self.requests['memory'])).compareTo(quantity('8Gi')) <= 0 : !has(self.limits) || !('memory' in self.limits) || isQuantity(string(self.limits['memory'])) && quantity(string(self.limits['memory'])).compareTo(quantity('8Gi')) <= 0",message="the agent may request at most 8Gi of memory (a limit without a request is the request): it runs at priority system-node-critical, and the scheduler preempts tenant pods to fit its request; set a higher limit with a request for more"
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// RDMAServiceSpec is what an administrator asks for: where to run RDMAvisor
// and how to size it.
type RDMAServiceSpec struct {
	// NodeSelector selects the nodes to run on. Empty or absent: all nodes.
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="nodeSelector operators must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))",message="nodeSelector In and NotIn need values; Exists and DoesNotExist take none"
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// Device selects the RDMA devices on each node.
	// +kubebuilder:default={}
	// +optional
	Device DeviceSelector `json:"device,omitempty"`

	// Transport is the QP type policy: rc, uc, ud, or auto (per message size).
	// rc and auto are reliable. uc and ud may lose messages and carry
	// smaller ones (ud: one MTU): on them pods can use messages only
	// (SendMsg, RecvMsg, up to the size each vconn reports), and the
	// net.Conn byte stream (Read, Write) fails with ErrNotStream.
	// +kubebuilder:default=auto
	// +optional
	Transport Transport `json:"transport,omitempty"`

	// QPsPerPeer is the number of shared queue pairs an agent keeps per
	// peer node; every vconn to that peer is multiplexed over them.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	// +optional
	QPsPerPeer *int32 `json:"qpsPerPeer,omitempty"`

	// BufferPoolSize is the registered buffer memory of each agent, in bytes
	// (a quantity such as 64Mi), between 1Mi and 64Gi.
	// +kubebuilder:default="64Mi"
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('64Gi')) <= 0",message="bufferPoolSize must be a whole number of bytes between 1Mi and 64Gi"
	// +optional
	BufferPoolSize *resource.Quantity `json:"bufferPoolSize,omitempty"`

	// VConnsPerNode is how many vconns each node offers to pods: the device
	// plugin's capacity of ResourceName. At most 65536, since the kubelet
	// receives one device entry per vconn.
	// +kubebuilder:default=1024
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	// +optional
	VConnsPerNode *int32 `json:"vconnsPerNode,omitempty"`

	// ResourceName is the extended resource pods request to get vconns:
	// rdmavisor.io/ and a name. It cannot change (pods already hold it).
	// Only RDMAvisor's own domain: the kubelet gives a resource to the last
	// plugin that registers it, so a service naming another vendor's
	// resource (nvidia.com/gpu) would take it over on its nodes. Not its
	// subdomains either: the name after the slash already tells services
	// apart, and the device plugin recognises its own sockets by the domain.
	// +kubebuilder:default="rdmavisor.io/vconn"
	// +kubebuilder:validation:MaxLength=76
	// +kubebuilder:validation:XValidation:rule="self.matches('^rdmavisor[.]io/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')",message="resourceName must be rdmavisor.io/ and a name, such as rdmavisor.io/vconn: a service may not take over another domain's resource"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="resourceName is immutable"
	// +optional
	ResourceName string `json:"resourceName,omitempty"`

	// Agent configures the agent pods.
	// +kubebuilder:default={}
	// +optional
	Agent AgentSpec `json:"agent,omitempty"`

	// Tolerations of the agent pods, so they can run on tainted nodes.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// SocketGroup is the group of every allocation's socket, which is mode
	// 0660 and owned by root: a pod that does not run as root connects to
	// its allocation's socket only with this group id among its
	// securityContext.supplementalGroups (a pod running as root connects
	// anyway). Each pod still sees only its own allocation's socket, which
	// the device plugin mounts into it. Absent: 0, root's group. A group
	// id from 0 to 2147483647, as supplementalGroups accepts.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	// +optional
	SocketGroup *int64 `json:"socketGroup,omitempty"`

	// Allocation is how pods get vconns: DevicePlugin (the extended
	// resource ResourceName), DRA (ResourceClaims of the DRA driver's
	// DeviceClass; a DeviceClass with extendedResourceName serves
	// resources.limits too) or Both. The agents' pods roll when it changes.
	// +kubebuilder:default=DevicePlugin
	// +kubebuilder:validation:XValidation:rule="self in ['DevicePlugin', 'DRA', 'Both']",message="allocation must be DevicePlugin, DRA or Both"
	// +optional
	Allocation Allocation `json:"allocation,omitempty"`

	// Limits bound what each pod's allocation may hold of its node's
	// agent, and send, and the memory all of them may register. Absent:
	// the agent's defaults. The agents' pods roll when it changes.
	// +optional
	Limits *Limits `json:"limits,omitempty"`
}

// RDMAServiceStatus is what the operator observed, aggregated from the
// RDMANodes of the service.
type RDMAServiceStatus struct {
	// Conditions: Ready, Progressing, Degraded and Conflict.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// ObservedGeneration is the generation last reconciled without error.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// DesiredNodes is the number of nodes the service deploys to: selected,
	// tolerated, and not claimed by an older service.
	// +optional
	DesiredNodes int32 `json:"desiredNodes,omitempty"`

	// ReadyNodes is the number of those nodes whose agent reports ready.
	// +optional
	ReadyNodes int32 `json:"readyNodes,omitempty"`

	// Nodes is "ready/desired", for kubectl get.
	// +optional
	Nodes string `json:"nodes,omitempty"`

	// VConnCapacity is the sum of the vconn capacity the agents report.
	// +kubebuilder:default=0
	// +optional
	VConnCapacity int64 `json:"vconnCapacity"`

	// VConnsAllocated is the sum of the vconns allocated to pods on the
	// agents' nodes (their quotas, open or not).
	// +kubebuilder:default=0
	// +optional
	VConnsAllocated int64 `json:"vconnsAllocated"`

	// VConnsInUse is the sum of the vconns open on the agents.
	// +kubebuilder:default=0
	// +optional
	VConnsInUse int64 `json:"vconnsInUse"`

	// QPsInUse is the sum of the queue pairs the agents hold.
	// +optional
	QPsInUse int64 `json:"qpsInUse,omitempty"`
}

// RDMAService runs RDMAvisor on a set of nodes: a node agent, device plugin
// and CNI plugin on each, sharing a few queue pairs per peer among many vconns.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=rdmasvc,categories=rdmavisor
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodes`,description="Nodes ready/desired"
// +kubebuilder:printcolumn:name="Capacity",type=integer,JSONPath=`.status.vconnCapacity`,description="vconns the nodes offer"
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.vconnsAllocated`,description="vconns allocated to pods"
// +kubebuilder:printcolumn:name="Open",type=integer,JSONPath=`.status.vconnsInUse`,description="vconns open"
// +kubebuilder:printcolumn:name="Progressing",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].status`,priority=1
// +kubebuilder:printcolumn:name="Conflict",type=string,JSONPath=`.status.conditions[?(@.type=="Conflict")].status`,priority=1
// +kubebuilder:printcolumn:name="Resource",type=string,JSONPath=`.spec.resourceName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40",message="metadata.name must be at most 40 characters: it prefixes the names of the objects the operator creates"
type RDMAService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec RDMAServiceSpec `json:"spec,omitempty"`
	// +optional
	Status RDMAServiceStatus `json:"status,omitempty"`
}

// RDMAServiceList is a list of RDMAServices.
//
// +kubebuilder:object:root=true
type RDMAServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RDMAService `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RDMAService{}, &RDMAServiceList{})
}

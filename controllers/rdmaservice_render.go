package controllers

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	rbacv1ac "k8s.io/client-go/applyconfigurations/rbac/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// Labels on every object the operator renders.
const (
	LabelService   = "rdmavisor.io/service"
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelManagedBy = "app.kubernetes.io/managed-by"
	agentAppName   = "rdmavisor-agent"
	// FieldOwner is the server-side apply field manager of the operator.
	FieldOwner = "rdmavisor-operator"

	annotationConfigHash = "rdmavisor.io/config-hash"
	// The de facto scrape annotations (Prometheus' kubernetes_sd pod
	// role, as the community chart configures it): they need no Service,
	// which a DaemonSet on the host network would only use for discovery.
	annotationScrape     = "prometheus.io/scrape"
	annotationScrapePort = "prometheus.io/port"
	annotationScrapePath = "prometheus.io/path"
	// The agents serve /metrics over TLS only (internal/metricsauth).
	annotationScrapeScheme = "prometheus.io/scheme"
	// pluginMetricsPort serves the device plugin's metrics (its
	// --metrics-address); the agent's port is the config's metricsAddress.
	pluginMetricsPort = 7473
	configKey         = "agent.yaml"
	configMountDir    = "/etc/rdmavisor"
	nodeNameExtra     = "authentication.kubernetes.io/node-name"
	// The agent's node certificate: requested by the agent at start (a
	// CertificateSigningRequest the CertSigner signs) into a memory-backed
	// emptyDir, so its key never touches the node's disk nor outlives the
	// pod. The CA bundle is the CA ConfigMap. Neither is inside another
	// mount: a mount point cannot be made in a read-only ConfigMap volume,
	// and one in the sockets' hostPath would be made on the node.
	tlsMountDir = "/etc/rdmavisor-tls"
	caMountDir  = "/etc/rdmavisor-ca"
)

// Host paths the agent pods mount.
const (
	hostDevicePluginDir = "/var/lib/kubelet/device-plugins"
	hostPodResourcesDir = "/var/lib/kubelet/pod-resources"
	hostCNIBinDir       = "/opt/cni/bin"
	hostCNIConfDir      = "/etc/cni/net.d"
	// The kubelet finds DRA drivers by their registration sockets, and
	// talks to each at plugins/<driver> (the driver's own directory, which
	// the kubelet plugin helper does not make: the hostPath does), driver
	// dra.DefaultDriverName; runtimes read the CDI specs the device plugin
	// (-cdi) and the DRA driver write in /var/run/cdi.
	hostPluginsRegistryDir = "/var/lib/kubelet/plugins_registry"
	hostDRAPluginDir       = "/var/lib/kubelet/plugins/rdmavisor.io"
	hostCDIDir             = "/var/run/cdi"
)

// agentPriorityClass is the agent pods' priority: the node's data plane for
// every pod holding vconns, like its CNI plugin and kube-proxy, which run
// at the same class. The scheduler preempts any other pod to fit an agent,
// so the schema and validateSpec bound what an agent may request.
const agentPriorityClass = "system-node-critical"

// agentMinReadySeconds is how long a new agent stays ready before the
// DaemonSet counts it available and takes the next node's agent down.
const agentMinReadySeconds = 5

// agentObjectPrefix starts the name of every object rendered for an
// RDMAService; the policies in static.go recognise the agents' service
// accounts and the operator's bindings by it.
const agentObjectPrefix = "rdmavisor-agent-"

// objectName is the name of every object rendered for svc: one name for the
// DaemonSet, ConfigMap, ServiceAccount and ClusterRoleBinding. RDMAService
// names are at most 40 characters, so it fits a label value.
func objectName(svc *v1alpha1.RDMAService) string { return agentObjectPrefix + svc.Name }

func commonLabels(svc *v1alpha1.RDMAService) map[string]string {
	return map[string]string{
		labelName:      agentAppName,
		labelInstance:  svc.Name,
		labelManagedBy: FieldOwner,
		LabelService:   svc.Name,
	}
}

// selectorLabels select the agent pods of svc. A DaemonSet selector is
// immutable: never change these.
func selectorLabels(svc *v1alpha1.RDMAService) map[string]string {
	return map[string]string{labelName: agentAppName, LabelService: svc.Name}
}

func ownerRef(svc *v1alpha1.RDMAService) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(v1alpha1.GroupVersion.String()).
		WithKind("RDMAService").
		WithName(svc.Name).
		WithUID(svc.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}

// renderConfig turns the spec into the agent's configuration file. Defaults
// repeat the schema's, for objects stored before a default existed.
func renderConfig(svc *v1alpha1.RDMAService) (*config.AgentConfig, []byte, error) {
	s := svc.Spec
	cfg := config.Default()
	cfg.ServiceName = svc.Name
	if s.Device.Provider != "" {
		cfg.Device.Provider = config.Provider(s.Device.Provider)
	}
	cfg.Device.Names = slices.Clone(s.Device.Names)
	cfg.Device.Vendors = slices.Clone(s.Device.Vendors)
	cfg.Device.Rails = int(s.Device.Rails)
	if s.Transport != "" {
		cfg.Transport = config.Transport(s.Transport)
	}
	if s.QPsPerPeer != nil {
		cfg.QPsPerPeer = int(*s.QPsPerPeer)
	}
	if s.BufferPoolSize != nil {
		cfg.BufferPoolBytes = s.BufferPoolSize.Value()
	}
	if s.VConnsPerNode != nil {
		cfg.VConnsPerNode = int(*s.VConnsPerNode)
	}
	if s.ResourceName != "" {
		cfg.ResourceName = s.ResourceName
	}
	if s.SocketGroup != nil {
		cfg.SocketGID = int(*s.SocketGroup)
	}
	renderLimits(s.Limits, &cfg.Limits)
	cfg.Pollers = pollersFor(s.Agent.Resources)
	cfg.PeerDiscovery = config.PeerDiscovery{Mode: config.DiscoveryKubernetes}
	// Agents always authenticate each other: there is no opt-out.
	cfg.TLS = config.TLSConfig{
		CertFile: tlsMountDir + "/" + corev1.TLSCertKey,
		KeyFile:  tlsMountDir + "/" + corev1.TLSPrivateKeyKey,
		CAFile:   caMountDir + "/" + CABundleKey,
	}
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("rendering agent config: %w", err)
	}
	data, err := cfg.Marshal()
	if err != nil {
		return nil, nil, err
	}
	return cfg, data, nil
}

// pollersFor is the pollers of an agent with resources r: one per whole
// CPU of its limit, at least one. Each poller keeps a core busy under load,
// so a fractional core is left to the rest of the agent; Go's own default
// (GOMAXPROCS) rounds a limit up, and to at least 2. Without a CPU limit,
// zero: the agent takes one per CPU GOMAXPROCS gives it.
func pollersFor(r *corev1.ResourceRequirements) int {
	if r == nil {
		return 0
	}
	cpu, ok := r.Limits[corev1.ResourceCPU]
	if !ok || cpu.IsZero() {
		return 0
	}
	return int(min(max(cpu.MilliValue()/1000, 1), config.MaxPollers))
}

func renderConfigMap(svc *v1alpha1.RDMAService, namespace string, data []byte) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(objectName(svc), namespace).
		WithLabels(commonLabels(svc)).
		WithOwnerReferences(ownerRef(svc)).
		WithData(map[string]string{configKey: string(data)})
}

func renderServiceAccount(svc *v1alpha1.RDMAService, namespace string) *corev1ac.ServiceAccountApplyConfiguration {
	return corev1ac.ServiceAccount(objectName(svc), namespace).
		WithLabels(commonLabels(svc)).
		WithOwnerReferences(ownerRef(svc))
}

// renderClusterRoleBinding binds the agents' service account to the
// AgentClusterRole the chart installs. The operator holds bind on that role
// and no other, so it creates no ClusterRole of its own.
func renderClusterRoleBinding(svc *v1alpha1.RDMAService, namespace string) *rbacv1ac.ClusterRoleBindingApplyConfiguration {
	return rbacv1ac.ClusterRoleBinding(objectName(svc)).
		WithLabels(commonLabels(svc)).
		WithOwnerReferences(ownerRef(svc)).
		WithRoleRef(rbacv1ac.RoleRef().WithAPIGroup("rbac.authorization.k8s.io").WithKind("ClusterRole").WithName(AgentClusterRole)).
		WithSubjects(rbacv1ac.Subject().WithKind("ServiceAccount").WithName(objectName(svc)).WithNamespace(namespace))
}

// renderNodeAffinity restricts the DaemonSet to the nodes svc selects, minus
// those an older service already serves. Nil when every node is eligible.
func renderNodeAffinity(sel *metav1.LabelSelector, excluded []string) *corev1ac.AffinityApplyConfiguration {
	term := corev1ac.NodeSelectorTerm()
	var empty = true
	if sel != nil {
		for _, k := range slices.Sorted(maps.Keys(sel.MatchLabels)) {
			term.WithMatchExpressions(corev1ac.NodeSelectorRequirement().
				WithKey(k).WithOperator(corev1.NodeSelectorOpIn).WithValues(sel.MatchLabels[k]))
			empty = false
		}
		for _, e := range sel.MatchExpressions {
			// LabelSelector operators (In, NotIn, Exists, DoesNotExist) are
			// spelled as their NodeSelector counterparts.
			term.WithMatchExpressions(corev1ac.NodeSelectorRequirement().
				WithKey(e.Key).WithOperator(corev1.NodeSelectorOperator(e.Operator)).WithValues(e.Values...))
			empty = false
		}
	}
	if len(excluded) > 0 {
		term.WithMatchFields(corev1ac.NodeSelectorRequirement().
			WithKey("metadata.name").WithOperator(corev1.NodeSelectorOpNotIn).WithValues(excluded...))
		empty = false
	}
	if empty {
		return nil
	}
	return corev1ac.Affinity().WithNodeAffinity(corev1ac.NodeAffinity().
		WithRequiredDuringSchedulingIgnoredDuringExecution(corev1ac.NodeSelector().WithNodeSelectorTerms(term)))
}

func hostPathVolume(name, path string, typ corev1.HostPathType) *corev1ac.VolumeApplyConfiguration {
	return corev1ac.Volume().WithName(name).WithHostPath(corev1ac.HostPathVolumeSource().WithPath(path).WithType(typ))
}

func mount(name, path string, readOnly bool) *corev1ac.VolumeMountApplyConfiguration {
	m := corev1ac.VolumeMount().WithName(name).WithMountPath(path)
	if readOnly {
		m.WithReadOnly(true)
	}
	return m
}

func envFromField(name, path string) *corev1ac.EnvVarApplyConfiguration {
	return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
		WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath(path)))
}

// allocation is the service's spec.allocation, DevicePlugin when unset (an
// object stored before the field existed).
func allocation(svc *v1alpha1.RDMAService) (devicePlugin, dra bool) {
	switch svc.Spec.Allocation {
	case v1alpha1.AllocationDRA:
		return false, true
	case v1alpha1.AllocationBoth:
		return true, true
	default:
		return true, false
	}
}

// hardened is the security context of the agent pod's unprivileged
// containers: every capability dropped but add, no privilege escalation, a
// read-only root filesystem (they write only to their volumes). They run as
// root, without capabilities, because the host paths they serve are root's:
// the kubelet's device-plugin and pod-resources sockets (a unix socket needs
// write permission to connect), its plugin directory, the node's CNI
// directories and the sockets directory. Root without CAP_DAC_OVERRIDE
// reaches only what root owns; the image's user is not relied upon.
func hardened(add ...corev1.Capability) *corev1ac.SecurityContextApplyConfiguration {
	caps := corev1ac.Capabilities().WithDrop("ALL")
	if len(add) > 0 {
		caps.WithAdd(add...)
	}
	return corev1ac.SecurityContext().
		WithRunAsUser(0).
		WithAllowPrivilegeEscalation(false).
		WithReadOnlyRootFilesystem(true).
		WithCapabilities(caps)
}

func tolerationApply(t *corev1.Toleration) *corev1ac.TolerationApplyConfiguration {
	a := corev1ac.Toleration()
	if t.Key != "" {
		a.WithKey(t.Key)
	}
	if t.Operator != "" {
		a.WithOperator(t.Operator)
	}
	if t.Value != "" {
		a.WithValue(t.Value)
	}
	if t.Effect != "" {
		a.WithEffect(t.Effect)
	}
	if t.TolerationSeconds != nil {
		a.WithTolerationSeconds(*t.TolerationSeconds)
	}
	return a
}

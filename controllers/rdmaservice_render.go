package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
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

// renderDaemonSet renders the agent DaemonSet. One image holds the four
// binaries; their command lines are the contract with cmd/node-agent,
// cmd/device-plugin, cmd/dra-driver and cmd/rdmavisor-cni, which all read the
// same config file. The device plugin and the DRA driver run as
// spec.allocation says; cdi: every node's runtime applies CDI specs, so
// the device plugin names its allocations as CDI devices too.
func renderDaemonSet(svc *v1alpha1.RDMAService, namespace, image string, cfg *config.AgentConfig, cfgData []byte, excluded []string, cdi bool) *appsv1ac.DaemonSetApplyConfiguration {
	sum := sha256.Sum256(cfgData)
	configFile := configMountDir + "/" + configKey
	pull := svc.Spec.Agent.ImagePullPolicy

	volumes := []*corev1ac.VolumeApplyConfiguration{
		corev1ac.Volume().WithName("config").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(objectName(svc))),
		hostPathVolume("sockets", cfg.SocketDir, corev1.HostPathDirectoryOrCreate),
		hostPathVolume("device-plugins", hostDevicePluginDir, corev1.HostPathDirectory),
		hostPathVolume("pod-resources", hostPodResourcesDir, corev1.HostPathDirectory),
		hostPathVolume("cni-bin", hostCNIBinDir, corev1.HostPathDirectoryOrCreate),
		hostPathVolume("cni-conf", hostCNIConfDir, corev1.HostPathDirectoryOrCreate),
		// Persistent, unlike the sockets' directory (a tmpfs on most
		// nodes): the device plugin's key of allocation ids must outlive
		// reboots, as the kubelet's record of the pods' mounts does.
		hostPathVolume("state", cfg.StateDir, corev1.HostPathDirectoryOrCreate),
		corev1ac.Volume().WithName("tls").WithEmptyDir(corev1ac.EmptyDirVolumeSource().
			WithMedium(corev1.StorageMediumMemory).WithSizeLimit(resource.MustParse("1Mi"))),
		// The reconciler publishes the ConfigMap before it applies the
		// DaemonSet; a CA rotated later reaches the running agents, whose
		// TLS source reloads the file.
		corev1ac.Volume().WithName("ca").WithConfigMap(corev1ac.ConfigMapVolumeSource().WithName(CAName).
			WithItems(corev1ac.KeyToPath().WithKey(CABundleKey).WithPath(CABundleKey))),
	}
	agentMounts := []*corev1ac.VolumeMountApplyConfiguration{
		mount("config", configMountDir, true),
		mount("tls", tlsMountDir, false),
		mount("ca", caMountDir, true),
		mount("sockets", cfg.SocketDir, false),
		mount("pod-resources", hostPodResourcesDir, true),
	}
	// CHOWN: the agent gives each allocation's socket to the configured
	// socketUID/socketGID (0660), which takes it unless both are root.
	agentSecurity := hardened("CHOWN")
	if cfg.Device.Provider == config.ProviderIBVerbs {
		// Verbs open the uverbs character devices, which the device
		// cgroup denies an unprivileged container even when they are
		// mounted, and pin registered memory (IPC_LOCK): the agent owns
		// the node's RDMA devices, so it runs privileged, and sees the
		// host's /dev. A device plugin for /dev/infiniband (or CDI) would
		// let it drop that; until then privileged implies every
		// capability, so none is dropped. A node without a device still
		// runs the agent, which then says why in its RDMANode.
		agentSecurity = corev1ac.SecurityContext().WithPrivileged(true).WithReadOnlyRootFilesystem(true)
	}
	// Validate accepted the address, so the port parses.
	_, port, _ := net.SplitHostPort(cfg.MetricsAddress)
	metricsPort, _ := strconv.Atoi(port)
	probe := func(path string, period int32) *corev1ac.ProbeApplyConfiguration {
		return corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromString("metrics"))).
			WithPeriodSeconds(period)
	}

	agent := corev1ac.Container().
		WithName("agent").
		WithImage(image).
		WithCommand("node-agent", "--config="+configFile).
		WithEnv(envFromField("NODE_NAME", "spec.nodeName"), envFromField("NODE_IP", "status.hostIP")).
		WithPorts(
			corev1ac.ContainerPort().WithName("control").WithContainerPort(int32(cfg.ControlPort)).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(int32(metricsPort)).WithProtocol(corev1.ProtocolTCP),
		).
		WithVolumeMounts(agentMounts...).
		WithSecurityContext(agentSecurity).
		WithLivenessProbe(probe("/healthz", 10)).
		// Probed often: a new agent's node serves again, and the roll
		// goes on, soon after the agent is ready, not a period later.
		WithReadinessProbe(probe("/readyz", 2))
	if cfg.Device.Provider == config.ProviderSoft {
		agent.WithPorts(corev1ac.ContainerPort().WithName("roce").WithContainerPort(int32(cfg.Soft.UDPPort)).WithProtocol(corev1.ProtocolUDP))
	}
	if r := svc.Spec.Agent.Resources; r != nil {
		res := corev1ac.ResourceRequirements()
		if r.Limits != nil {
			res.WithLimits(r.Limits)
		}
		if r.Requests != nil {
			res.WithRequests(r.Requests)
		}
		agent.WithResources(res)
	}

	devicePlugin := corev1ac.Container().
		WithName("device-plugin").
		WithImage(image).
		WithCommand("device-plugin", "--config="+configFile, fmt.Sprintf("--metrics-address=:%d", pluginMetricsPort)).
		WithEnv(envFromField("NODE_NAME", "spec.nodeName")).
		WithPorts(corev1ac.ContainerPort().WithName("plugin-metrics").WithContainerPort(pluginMetricsPort).WithProtocol(corev1.ProtocolTCP)).
		WithVolumeMounts(
			mount("config", configMountDir, true),
			mount("sockets", cfg.SocketDir, false),
			mount("device-plugins", hostDevicePluginDir, false),
			// Pod resources map allocations to pods, so the plugin can
			// collect the quota of pods that are gone.
			mount("pod-resources", hostPodResourcesDir, true),
			// The key that allocation ids derive from (deviceplugin.KeyFile),
			// made by the plugin on first start; no other container mounts it.
			mount("state", cfg.StateDir, false),
		).
		WithSecurityContext(hardened())
	withDevicePlugin, withDRA := allocation(svc)
	if cdi && withDevicePlugin {
		devicePlugin.WithCommand("--cdi") // appends
	}
	if withDevicePlugin && cdi || withDRA {
		volumes = append(volumes, hostPathVolume("cdi", hostCDIDir, corev1.HostPathDirectoryOrCreate))
		if withDevicePlugin && cdi {
			devicePlugin.WithVolumeMounts(mount("cdi", hostCDIDir, false))
		}
	}

	// The DRA driver: a kubelet plugin (its registration socket and its
	// own socket directory) that asks the agent for each claim's
	// allocation through the sockets' directory and writes its CDI spec.
	// It publishes the node's ResourceSlice with the agents' service
	// account (AgentRules).
	draDriver := corev1ac.Container().
		WithName("dra-driver").
		WithImage(image).
		WithCommand("dra-driver", "--config="+configFile).
		WithEnv(envFromField("NODE_NAME", "spec.nodeName")).
		WithVolumeMounts(
			mount("config", configMountDir, true),
			mount("sockets", cfg.SocketDir, false),
			mount("plugins-registry", hostPluginsRegistryDir, false),
			mount("dra-plugin", hostDRAPluginDir, false),
			mount("cdi", hostCDIDir, false),
		).
		WithSecurityContext(hardened())
	if withDRA {
		volumes = append(volumes,
			hostPathVolume("plugins-registry", hostPluginsRegistryDir, corev1.HostPathDirectoryOrCreate),
			hostPathVolume("dra-plugin", hostDRAPluginDir, corev1.HostPathDirectoryOrCreate))
	}

	// A native sidecar (an init container that keeps running): it chains
	// the CNI plugin before the agent starts, repairs the chain if the
	// primary CNI rewrites its file, and, stopped after the agent when the
	// pod goes (the service deleted, the node deselected), takes it out
	// again, so no node is left calling a plugin whose agent is gone.
	cniInstall := corev1ac.Container().
		WithName("cni").
		WithImage(image).
		WithRestartPolicy(corev1.ContainerRestartPolicyAlways).
		WithCommand("rdmavisor-cni", "install", "--keep",
			"--config="+configFile,
			"--cni-bin-dir=/host"+hostCNIBinDir,
			"--cni-conf-dir=/host"+hostCNIConfDir).
		WithVolumeMounts(
			mount("config", configMountDir, true),
			mount("cni-bin", "/host"+hostCNIBinDir, false),
			mount("cni-conf", "/host"+hostCNIConfDir, false),
		).
		WithSecurityContext(hardened())

	containers := []*corev1ac.ContainerApplyConfiguration{agent}
	if withDevicePlugin {
		containers = append(containers, devicePlugin)
	}
	if withDRA {
		containers = append(containers, draDriver)
	}
	for _, c := range append(containers, cniInstall) {
		if pull != "" {
			c.WithImagePullPolicy(pull)
		}
	}

	pod := corev1ac.PodSpec().
		WithServiceAccountName(objectName(svc)).
		WithSecurityContext(corev1ac.PodSecurityContext().
			WithSeccompProfile(corev1ac.SeccompProfile().WithType(corev1.SeccompProfileTypeRuntimeDefault))).
		// The agent serves peers on the node IP (RoCEv2 UDP and the control
		// port), so it lives in the host network namespace.
		WithHostNetwork(true).
		WithDNSPolicy(corev1.DNSClusterFirstWithHostNet).
		WithPriorityClassName(agentPriorityClass).
		WithInitContainers(cniInstall).
		WithContainers(containers...).
		WithVolumes(volumes...)
	if aff := renderNodeAffinity(svc.Spec.NodeSelector, excluded); aff != nil {
		pod.WithAffinity(aff)
	}
	for i := range svc.Spec.Tolerations {
		pod.WithTolerations(tolerationApply(&svc.Spec.Tolerations[i]))
	}

	return appsv1ac.DaemonSet(objectName(svc), namespace).
		WithLabels(commonLabels(svc)).
		// Which spec this DaemonSet renders: until the cache holds it,
		// the rollout it reports is the previous spec's (rollout).
		WithAnnotations(map[string]string{annotationServiceGeneration: strconv.FormatInt(svc.Generation, 10)}).
		WithOwnerReferences(ownerRef(svc)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(svc))).
			// A changed configuration or image rolls one node at a time:
			// the old agent goes before the new one starts (they share the
			// node's ports and device, so no surge), and the next node
			// waits until the new agent has stayed ready a while, so an
			// agent that fails soon after it starts stops the roll on its
			// first node.
			WithUpdateStrategy(appsv1ac.DaemonSetUpdateStrategy().
				WithType(appsv1.RollingUpdateDaemonSetStrategyType).
				WithRollingUpdate(appsv1ac.RollingUpdateDaemonSet().
					WithMaxUnavailable(intstr.FromInt32(1)).
					WithMaxSurge(intstr.FromInt32(0)))).
			WithMinReadySeconds(agentMinReadySeconds).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(commonLabels(svc)).
				// A changed config rolls the pods, which read it only at start.
				WithAnnotations(map[string]string{
					annotationConfigHash: hex.EncodeToString(sum[:8]),
					annotationScrape:     "true",
					annotationScrapePort: strconv.Itoa(metricsPort),
					annotationScrapePath: "/metrics",
				}).
				WithSpec(pod)))
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

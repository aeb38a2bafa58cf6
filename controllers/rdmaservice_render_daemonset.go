package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// configFile is where the agent pod's containers read the config file.
const configFile = configMountDir + "/" + configKey

// renderDaemonSet renders the agent DaemonSet. One image holds the four
// binaries; their command lines are the contract with cmd/node-agent,
// cmd/device-plugin, cmd/dra-driver and cmd/rdmavisor-cni, which all read the
// same config file. The device plugin and the DRA driver run as
// spec.allocation says; cdi: every node's runtime applies CDI specs, so
// the device plugin names its allocations as CDI devices too.
func renderDaemonSet(svc *v1alpha1.RDMAService, namespace, image string, cfg *config.AgentConfig, cfgData []byte, excluded []string, cdi bool) *appsv1ac.DaemonSetApplyConfiguration {
	sum := sha256.Sum256(cfgData)
	metricsPort := metricsPortOf(cfg)
	withDevicePlugin, withDRA := allocation(svc)
	pluginCDI := withDevicePlugin && cdi

	volumes := agentPodVolumes(svc, cfg)
	if pluginCDI || withDRA {
		volumes = append(volumes, hostPathVolume("cdi", hostCDIDir, corev1.HostPathDirectoryOrCreate))
	}
	if withDRA {
		volumes = append(volumes,
			hostPathVolume("plugins-registry", hostPluginsRegistryDir, corev1.HostPathDirectoryOrCreate),
			hostPathVolume("dra-plugin", hostDRAPluginDir, corev1.HostPathDirectoryOrCreate))
	}
	containers := []*corev1ac.ContainerApplyConfiguration{agentContainer(svc, image, cfg, metricsPort)}
	if withDevicePlugin {
		containers = append(containers, devicePluginContainer(image, cfg, pluginCDI))
	}
	if withDRA {
		containers = append(containers, draDriverContainer(image, cfg))
	}
	cniInstall := cniContainer(image)
	if pull := svc.Spec.Agent.ImagePullPolicy; pull != "" {
		for _, c := range append(containers, cniInstall) {
			c.WithImagePullPolicy(pull)
		}
	}
	pod := agentPodSpec(svc, excluded, cniInstall, containers, volumes)

	return appsv1ac.DaemonSet(objectName(svc), namespace).
		WithLabels(commonLabels(svc)).
		// Which spec this DaemonSet renders: until the cache holds it,
		// the rollout it reports is the previous spec's (rollout).
		WithAnnotations(map[string]string{annotationServiceGeneration: strconv.FormatInt(svc.Generation, 10)}).
		WithOwnerReferences(ownerRef(svc)).
		WithSpec(appsv1ac.DaemonSetSpec().
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(svc))).
			WithUpdateStrategy(agentUpdateStrategy()).
			WithMinReadySeconds(agentMinReadySeconds).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(commonLabels(svc)).
				// A changed config rolls the pods, which read it only at start.
				WithAnnotations(map[string]string{
					annotationConfigHash:   hex.EncodeToString(sum[:8]),
					annotationScrape:       "true",
					annotationScrapePort:   strconv.Itoa(metricsPort),
					annotationScrapePath:   "/metrics",
					annotationScrapeScheme: "https",
				}).
				WithSpec(pod)))
}

// metricsPortOf is the port of the agent's metrics address. Validate
// accepted the address, so the port parses.
func metricsPortOf(cfg *config.AgentConfig) int {
	_, port, _ := net.SplitHostPort(cfg.MetricsAddress)
	metricsPort, _ := strconv.Atoi(port)
	return metricsPort
}

// agentUpdateStrategy: a changed configuration or image rolls one node at a
// time: the old agent goes before the new one starts (they share the node's
// ports and device, so no surge), and the next node waits until the new
// agent has stayed ready a while, so an agent that fails soon after it
// starts stops the roll on its first node.
func agentUpdateStrategy() *appsv1ac.DaemonSetUpdateStrategyApplyConfiguration {
	return appsv1ac.DaemonSetUpdateStrategy().
		WithType(appsv1.RollingUpdateDaemonSetStrategyType).
		WithRollingUpdate(appsv1ac.RollingUpdateDaemonSet().
			WithMaxUnavailable(intstr.FromInt32(1)).
			WithMaxSurge(intstr.FromInt32(0)))
}

// agentPodVolumes are the volumes every agent pod has; the CDI and DRA
// ones follow them as spec.allocation needs.
func agentPodVolumes(svc *v1alpha1.RDMAService, cfg *config.AgentConfig) []*corev1ac.VolumeApplyConfiguration {
	return []*corev1ac.VolumeApplyConfiguration{
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
}

// agentSecurity is the agent container's security context.
func agentSecurity(cfg *config.AgentConfig) *corev1ac.SecurityContextApplyConfiguration {
	if cfg.Device.Provider == config.ProviderIBVerbs {
		// Verbs open the uverbs character devices, which the device
		// cgroup denies an unprivileged container even when they are
		// mounted, and pin registered memory (IPC_LOCK): the agent owns
		// the node's RDMA devices, so it runs privileged, and sees the
		// host's /dev. A device plugin for /dev/infiniband (or CDI) would
		// let it drop that; until then privileged implies every
		// capability, so none is dropped. A node without a device still
		// runs the agent, which then says why in its RDMANode.
		return corev1ac.SecurityContext().WithPrivileged(true).WithReadOnlyRootFilesystem(true)
	}
	// CHOWN: the agent gives each allocation's socket to the configured
	// socketUID/socketGID (0660), which takes it unless both are root.
	return hardened("CHOWN")
}

// metricsProbe probes path on the agent's metrics port every period seconds.
func metricsProbe(path string, period int32) *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().WithHTTPGet(corev1ac.HTTPGetAction().WithPath(path).WithPort(intstr.FromString("metrics"))).
		WithPeriodSeconds(period)
}

// agentContainer runs the node agent.
func agentContainer(svc *v1alpha1.RDMAService, image string, cfg *config.AgentConfig, metricsPort int) *corev1ac.ContainerApplyConfiguration {
	agent := corev1ac.Container().
		WithName("agent").
		WithImage(image).
		WithCommand("node-agent", "--config="+configFile).
		WithEnv(envFromField("NODE_NAME", "spec.nodeName"), envFromField("NODE_IP", "status.hostIP")).
		WithPorts(
			corev1ac.ContainerPort().WithName("control").WithContainerPort(int32(cfg.ControlPort)).WithProtocol(corev1.ProtocolTCP),
			corev1ac.ContainerPort().WithName("metrics").WithContainerPort(int32(metricsPort)).WithProtocol(corev1.ProtocolTCP),
		).
		WithVolumeMounts(
			mount("config", configMountDir, true),
			mount("tls", tlsMountDir, false),
			mount("ca", caMountDir, true),
			mount("sockets", cfg.SocketDir, false),
			mount("pod-resources", hostPodResourcesDir, true),
		).
		WithSecurityContext(agentSecurity(cfg)).
		WithLivenessProbe(metricsProbe("/healthz", 10)).
		// Probed often: a new agent's node serves again, and the roll
		// goes on, soon after the agent is ready, not a period later.
		WithReadinessProbe(metricsProbe("/readyz", 2))
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
	return agent
}

// devicePluginContainer runs the device plugin; cdi: it names its
// allocations as CDI devices, whose specs it writes in the node's CDI
// directory.
func devicePluginContainer(image string, cfg *config.AgentConfig, cdi bool) *corev1ac.ContainerApplyConfiguration {
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
	if cdi {
		devicePlugin.WithCommand("--cdi") // appends
		devicePlugin.WithVolumeMounts(mount("cdi", hostCDIDir, false))
	}
	return devicePlugin
}

// draDriverContainer runs the DRA driver: a kubelet plugin (its
// registration socket and its own socket directory) that asks the agent for
// each claim's allocation through the sockets' directory and writes its CDI
// spec. It publishes the node's ResourceSlice with the agents' service
// account (AgentRules).
func draDriverContainer(image string, cfg *config.AgentConfig) *corev1ac.ContainerApplyConfiguration {
	return corev1ac.Container().
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
}

// cniContainer is a native sidecar (an init container that keeps running):
// it chains the CNI plugin before the agent starts, repairs the chain if the
// primary CNI rewrites its file, and, stopped after the agent when the pod
// goes (the service deleted, the node deselected), takes it out again, so
// no node is left calling a plugin whose agent is gone.
func cniContainer(image string) *corev1ac.ContainerApplyConfiguration {
	return corev1ac.Container().
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
}

// agentPodSpec is the agent pod's spec, scheduled on the nodes svc selects
// but not those in excluded.
func agentPodSpec(svc *v1alpha1.RDMAService, excluded []string, cniInstall *corev1ac.ContainerApplyConfiguration,
	containers []*corev1ac.ContainerApplyConfiguration, volumes []*corev1ac.VolumeApplyConfiguration,
) *corev1ac.PodSpecApplyConfiguration {
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
	return pod
}

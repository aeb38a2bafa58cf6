package controllers

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// TestRenderMetrics: the agent pods expose the agent's metrics port (the
// config's metricsAddress) and the device plugin's, and carry the scrape
// annotations that name the agent's.
func TestRenderMetrics(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}}}
	cfg, data, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	ds := renderDaemonSet(svc, "ns", "img", cfg, data, nil, false)
	tmpl := ds.Spec.Template
	for k, want := range map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "7472", "prometheus.io/path": "/metrics", "prometheus.io/scheme": "https"} {
		if got := tmpl.Annotations[k]; got != want {
			t.Errorf("annotation %s = %q, want %q", k, got, want)
		}
	}
	ports := map[string]int32{}
	var pluginArgs []string
	for _, c := range tmpl.Spec.Containers {
		for _, p := range c.Ports {
			ports[*c.Name+"/"+*p.Name] = *p.ContainerPort
		}
		if *c.Name == "device-plugin" {
			pluginArgs = c.Command
		}
	}
	if ports["agent/metrics"] != 7472 || ports["device-plugin/plugin-metrics"] != 7473 {
		t.Errorf("ports %v, want agent/metrics 7472 and device-plugin/plugin-metrics 7473", ports)
	}
	if !slices.Contains(pluginArgs, "--metrics-address=:7473") {
		t.Errorf("device plugin command %q does not serve its metrics on its port", pluginArgs)
	}
}

// TestRenderDeviceAccess: an ibverbs agent runs privileged (the device
// cgroup would deny it the uverbs devices otherwise) and needs no host
// path that a node without RDMA lacks; a soft agent stays unprivileged.
func TestRenderDeviceAccess(t *testing.T) {
	for _, tc := range []struct {
		provider   v1alpha1.Provider
		privileged bool
	}{{v1alpha1.ProviderIBVerbs, true}, {v1alpha1.ProviderSoft, false}} {
		svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
			Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: tc.provider}}}
		cfg, data, err := renderConfig(svc)
		if err != nil {
			t.Fatal(err)
		}
		spec := renderDaemonSet(svc, "ns", "img", cfg, data, nil, false).Spec.Template.Spec
		for _, c := range spec.Containers {
			if *c.Name != "agent" {
				continue
			}
			sc := c.SecurityContext
			priv := sc != nil && sc.Privileged != nil && *sc.Privileged
			if priv != tc.privileged {
				t.Errorf("%s agent privileged %v, want %v", tc.provider, priv, tc.privileged)
			}
			if priv && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
				t.Errorf("%s agent: privileged with allowPrivilegeEscalation false, which the API refuses", tc.provider)
			}
		}
		for _, v := range spec.Volumes {
			if v.HostPath != nil && v.HostPath.Type != nil && *v.HostPath.Type == "Directory" && *v.HostPath.Path == "/dev/infiniband" {
				t.Errorf("%s agent needs /dev/infiniband on the node", tc.provider)
			}
		}
	}
}

// TestRenderTLS: agents authenticate each other by default. The config
// names the certificate files, the agent container mounts them where the
// config says (the key in a memory-backed emptyDir it writes, the CA from
// the published ConfigMap, read-only), and the agents' ClusterRole lets
// them request their certificate.
func TestRenderTLS(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}}}
	cfg, data, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	want := config.TLSConfig{CertFile: "/etc/rdmavisor-tls/tls.crt", KeyFile: "/etc/rdmavisor-tls/tls.key",
		CAFile: "/etc/rdmavisor-ca/ca.crt"}
	if cfg.TLS != want {
		t.Fatalf("config tls = %+v, want %+v", cfg.TLS, want)
	}
	if parsed, err := config.Load(data); err != nil || parsed.TLS != want {
		t.Fatalf("rendered file: tls %+v (%v), want %+v", parsed.TLS, err, want)
	}

	pod := renderDaemonSet(svc, "ns", "img", cfg, data, nil, false).Spec.Template.Spec
	volumes := map[string]corev1ac.VolumeApplyConfiguration{}
	for _, v := range pod.Volumes {
		volumes[*v.Name] = v
	}
	if v := volumes["tls"]; v.EmptyDir == nil || v.EmptyDir.Medium == nil || *v.EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("volume tls = %+v, want a memory-backed emptyDir", v)
	}
	if v := volumes["ca"]; v.ConfigMap == nil || *v.ConfigMap.Name != CAName || v.ConfigMap.Optional != nil {
		t.Errorf("volume ca = %+v, want ConfigMap %s (required)", v, CAName)
	}
	mounted := map[string]string{} // file's directory → "volume ro|rw", in the agent container
	for _, c := range pod.Containers {
		for _, m := range c.VolumeMounts {
			if *c.Name != "agent" {
				if *m.Name == "tls" || *m.Name == "ca" {
					t.Errorf("container %s mounts %s: only the agent needs the certificate", *c.Name, *m.Name)
				}
				continue
			}
			mode := "rw"
			if m.ReadOnly != nil && *m.ReadOnly {
				mode = "ro"
			}
			mounted[*m.MountPath] = *m.Name + " " + mode
		}
	}
	for file, wantMount := range map[string]string{want.CertFile: "tls rw", want.KeyFile: "tls rw", want.CAFile: "ca ro"} {
		if got := mounted[filepath.Dir(file)]; got != wantMount {
			t.Errorf("agent mount of %s = %q, want %q", file, got, wantMount)
		}
	}
	// No mount point inside another mount: one in a read-only ConfigMap
	// volume cannot be created.
	for a := range mounted {
		for b := range mounted {
			if a != b && strings.HasPrefix(a, b+"/") {
				t.Errorf("agent mount %s is inside mount %s", a, b)
			}
		}
	}

	var csr bool
	for _, r := range AgentRules() {
		if slices.Contains(r.APIGroups, "certificates.k8s.io") && slices.Contains(r.Resources, "certificatesigningrequests") {
			csr = slices.Contains(r.Verbs, "create") && slices.Contains(r.Verbs, "get")
			if len(r.ResourceNames) > 0 || len(r.Verbs) != 2 {
				t.Errorf("agents' CSR rule %+v grants more than create and get", r)
			}
		}
	}
	if !csr {
		t.Error("the agents' ClusterRole does not let them request their certificate (create, get certificatesigningrequests)")
	}
}

// TestRenderHardened: the agent pod runs under the runtime's seccomp
// profile; every container but a privileged ibverbs agent drops every
// capability but those it is allowed (wantCaps), cannot escalate, and has a
// read-only root filesystem.
func TestRenderHardened(t *testing.T) {
	wantCaps := map[string][]corev1.Capability{"agent": {"CHOWN"}, "device-plugin": nil, "cni": nil}
	for _, provider := range []v1alpha1.Provider{v1alpha1.ProviderSoft, v1alpha1.ProviderIBVerbs} {
		t.Run(string(provider), func(t *testing.T) {
			svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
				Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: provider}}}
			cfg, data, err := renderConfig(svc)
			if err != nil {
				t.Fatal(err)
			}
			spec := renderDaemonSet(svc, "ns", "img", cfg, data, nil, false).Spec.Template.Spec
			if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || *psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod securityContext %+v: want seccompProfile RuntimeDefault", psc)
			}
			containers := append(slices.Clone(spec.InitContainers), spec.Containers...)
			if len(containers) != len(wantCaps) {
				t.Fatalf("%d containers, want %d", len(containers), len(wantCaps))
			}
			for _, c := range containers {
				sc := c.SecurityContext
				if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					t.Errorf("%s: securityContext %+v: want a read-only root filesystem", *c.Name, sc)
					continue
				}
				if sc.Privileged != nil && *sc.Privileged {
					if provider != v1alpha1.ProviderIBVerbs || *c.Name != "agent" {
						t.Errorf("%s of a %s service runs privileged", *c.Name, provider)
					}
					continue
				}
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Errorf("%s: allowPrivilegeEscalation %v, want false", *c.Name, sc.AllowPrivilegeEscalation)
				}
				if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
					!slices.Equal(sc.Capabilities.Add, wantCaps[*c.Name]) {
					t.Errorf("%s: capabilities %+v, want ALL dropped and %v added", *c.Name, sc.Capabilities, wantCaps[*c.Name])
				}
			}
		})
	}
}

// TestRenderSocketGroup: spec.socketGroup reaches the agents as the
// configuration file's socketGID, the group of every allocation's socket
// (the owner stays root); absent, the file leaves both to root.
func TestRenderSocketGroup(t *testing.T) {
	for _, tt := range []struct {
		name  string
		group *int64
		want  int
	}{
		{"absent: root", nil, 0},
		{"root's group", ptr[int64](0), 0},
		{"a group", ptr[int64](3000), 3000},
		{"the largest group", ptr[int64](v1alpha1.MaxSocketGroup), v1alpha1.MaxSocketGroup},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
				Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}, SocketGroup: tt.group}}
			_, data, err := renderConfig(svc)
			if err != nil {
				t.Fatal(err)
			}
			// What the agent reads: the ConfigMap's file.
			cm := renderConfigMap(svc, "ns", data)
			cfg, err := config.Load([]byte(cm.Data[configKey]))
			if err != nil {
				t.Fatalf("rendered config does not load: %v", err)
			}
			if cfg.SocketGID != tt.want || cfg.SocketUID != 0 {
				t.Errorf("socketUID %d, socketGID %d; want 0, %d\n%s", cfg.SocketUID, cfg.SocketGID, tt.want, cm.Data[configKey])
			}
		})
	}
}

// TestRenderStateDir: the device plugin, and only it, mounts the config's
// stateDir from the host, writable, at the same path: it keeps there the
// key its allocation ids derive from, which must survive the pod and the
// node's reboots (the sockets' directory is usually a tmpfs).
func TestRenderStateDir(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}}}
	cfg, data, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir != config.DefaultStateDir {
		t.Fatalf("stateDir %q, want %q", cfg.StateDir, config.DefaultStateDir)
	}
	spec := renderDaemonSet(svc, "ns", "img", cfg, data, nil, false).Spec.Template.Spec
	var vol string
	for _, v := range spec.Volumes {
		if v.HostPath != nil && *v.HostPath.Path == cfg.StateDir {
			if *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("stateDir volume type %s, want DirectoryOrCreate", *v.HostPath.Type)
			}
			vol = *v.Name
		}
	}
	if vol == "" {
		t.Fatalf("no hostPath volume of %s", cfg.StateDir)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		var got []string
		for _, m := range c.VolumeMounts {
			if *m.Name == vol {
				got = append(got, *m.MountPath)
				if m.ReadOnly != nil && *m.ReadOnly {
					t.Errorf("%s mounts %s read-only", *c.Name, vol)
				}
			}
		}
		want := []string(nil)
		if *c.Name == "device-plugin" {
			want = []string{cfg.StateDir}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s mounts the state directory at %v, want %v", *c.Name, got, want)
		}
	}
}

// TestRenderRails: spec.device.rails reaches the agent's configuration,
// with the names in order (the first rails of them are its rails).
func TestRenderRails(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: v1alpha1.RDMAServiceSpec{
		Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderIBVerbs, Names: []string{"mlx5_0", "mlx5_1", "mlx5_2"}, Rails: 2}}}
	cfg, _, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Device.Rails != 2 || !slices.Equal(cfg.Device.Names, []string{"mlx5_0", "mlx5_1", "mlx5_2"}) {
		t.Fatalf("device %+v, want 2 rails of mlx5_0, mlx5_1", cfg.Device)
	}
	svc.Spec.Device.Rails = 0
	if cfg, _, err = renderConfig(svc); err != nil || cfg.Device.Rails != 0 {
		t.Fatalf("no rails: device %+v, %v; want the agent's one", cfg.Device, err)
	}
}

// TestRenderRoll: the agents roll one node at a time, the old agent gone
// before the new one starts, and the next node only once the new agent
// has stayed ready; readiness is probed often enough that a node is back
// soon after its agent is.
func TestRenderRoll(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}}}
	cfg, data, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	spec := renderDaemonSet(svc, "ns", "img", cfg, data, nil, false).Spec
	u := spec.UpdateStrategy
	if u == nil || *u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
		u.RollingUpdate.MaxUnavailable.IntValue() != 1 || u.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Fatalf("update strategy %+v, want a rolling update of one node at a time, no surge", u)
	}
	if spec.MinReadySeconds == nil || *spec.MinReadySeconds < 1 {
		t.Errorf("minReadySeconds %v: the roll must wait for a new agent to stay ready", spec.MinReadySeconds)
	}
	for _, c := range spec.Template.Spec.Containers {
		if *c.Name != "agent" {
			continue
		}
		if p := c.ReadinessProbe; p == nil || *p.PeriodSeconds > 2 || *p.HTTPGet.Path != "/readyz" {
			t.Errorf("agent readiness probe %+v, want /readyz at least every 2s", p)
		}
	}
}

// TestRenderLimits: spec.limits reaches the agents' agent.yaml, each set
// field as the agent's limit and each absent one as the agent's default
// (rates: unlimited, left out); a change of limits changes the pods'
// config hash, which rolls the agents as any configuration change does.
func TestRenderLimits(t *testing.T) {
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: v1alpha1.RDMAServiceSpec{Device: v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft}}}
	cfg, data, err := renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits != config.Default().Limits || strings.Contains(string(data), "Rate") {
		t.Fatalf("no spec.limits: limits %+v, want the agent's defaults without rates", cfg.Limits)
	}
	hash := func(data []byte) string {
		return renderDaemonSet(svc, "ns", "img", cfg, data, nil, false).Spec.Template.Annotations[annotationConfigHash]
	}
	before := hash(data)

	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	i32 := func(v int32) *int32 { return &v }
	svc.Spec.Limits = &v1alpha1.Limits{Sessions: i32(8), Listeners: i32(1), Regions: i32(16), RegionSize: q("256Mi"),
		QueuedSize: q("1Mi"), RegisteredSize: q("2Gi"), MessageRate: i32(5000), ByteRate: q("100Mi")}
	cfg, data, err = renderConfig(svc)
	if err != nil {
		t.Fatal(err)
	}
	// What the agent reads: the rendered file, loaded as the agent loads it.
	got, err := config.Load(data)
	if err != nil {
		t.Fatalf("the agent refuses the rendered agent.yaml: %v", err)
	}
	want := config.Limits{Sessions: 8, Listeners: 1, Regions: 16, RegionBytes: 256 << 20, QueuedBytes: 1 << 20,
		RegisteredBytes: 2 << 30, MessageRate: 5000, ByteRate: 100 << 20}
	if got.Limits != want {
		t.Errorf("agent.yaml limits %+v, want %+v", got.Limits, want)
	}
	for _, line := range []string{"listeners: 1\n", "messageRate: 5000\n", "byteRate: 104857600\n", "regionBytes: 268435456\n"} {
		if !strings.Contains(string(data), line) {
			t.Errorf("agent.yaml lacks %q:\n%s", line, data)
		}
	}
	if after := hash(data); after == before {
		t.Errorf("config hash %s unchanged by spec.limits: the agents would not roll", after)
	}

	// One field set: the others keep the agent's defaults.
	svc.Spec.Limits = &v1alpha1.Limits{Listeners: i32(1)}
	if cfg, _, err = renderConfig(svc); err != nil {
		t.Fatal(err)
	}
	want = config.Default().Limits
	want.Listeners = 1
	if cfg.Limits != want {
		t.Errorf("limits %+v, want listeners 1 and the agent's defaults", cfg.Limits)
	}
}

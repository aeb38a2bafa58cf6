package controllers

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
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
	ds := renderDaemonSet(svc, "ns", "img", cfg, data, nil)
	tmpl := ds.Spec.Template
	for k, want := range map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "7472", "prometheus.io/path": "/metrics"} {
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
		spec := renderDaemonSet(svc, "ns", "img", cfg, data, nil).Spec.Template.Spec
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

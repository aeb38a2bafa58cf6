package kubectlplugin

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The krew manifest installs this binary on each platform, from a
// release archive whose URI names the manifest's version.
func TestKrewManifest(t *testing.T) {
	b, err := os.ReadFile("../../plugins/rdmavisor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct{ Name string }
		Spec       struct {
			Version          string `json:"version"`
			Homepage         string `json:"homepage"`
			ShortDescription string `json:"shortDescription"`
			Description      string `json:"description"`
			Platforms        []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
				Bin    string `json:"bin"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "rdmavisor" ||
		!regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(m.Spec.Version) || m.Spec.ShortDescription == "" || len(m.Spec.Platforms) == 0 {
		t.Fatalf("manifest %+v", m)
	}
	for _, sub := range []string{"status", "pods", "top", "diagnose"} {
		if !strings.Contains(m.Spec.Description, sub) {
			t.Errorf("the description does not mention %s", sub)
		}
	}
	sha := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, p := range m.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		want := "/releases/download/" + m.Spec.Version + "/kubectl-rdmavisor_" + os + "_" + arch + ".tar.gz"
		if p.Bin != "kubectl-rdmavisor" || !strings.HasSuffix(p.URI, want) || !sha.MatchString(p.SHA256) {
			t.Errorf("platform %s/%s: %+v", os, arch, p)
		}
	}
}

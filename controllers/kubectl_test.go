package controllers

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
)

// kubectlTable runs kubectl get against the test API server and returns the
// header and the rows, split into columns.
func kubectlTable(t *testing.T, kubeconfig string, args ...string) (header []string, rows [][]string) {
	t.Helper()
	cmd := exec.CommandContext(testCtx(t), testenv.Kubectl(), append([]string{"--kubeconfig", kubeconfig, "get"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get %v: %v\n%s", args, err, out)
	}
	t.Logf("kubectl get %s\n%s", strings.Join(args, " "), out)
	// Columns are separated by at least two spaces.
	sep := regexp.MustCompile(`\s{2,}`)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i, l := range lines {
		cols := sep.Split(strings.TrimSpace(l), -1)
		if i == 0 {
			header = cols
		} else {
			rows = append(rows, cols)
		}
	}
	return header, rows
}

func TestKubectlColumns(t *testing.T) {
	createNodes(t, map[string]string{"kubectl": "true"}, "kc-1")
	createService(t, newService("kc", "kubectl"))
	reportNode(t, "kc-1", "kc", metav1.ConditionTrue, "Serving", "")
	rollDaemonSet(t, "kc", 1, 1, 1)
	waitCondition(t, "kc", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)
	waitCondition(t, "kc", v1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonComplete)
	kubeconfig, err := testenv.WriteKubeconfig(testEnv, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		args       []string
		wantHeader []string
		// wantRow omits the last column, the age.
		wantRow []string
	}{
		{
			args:       []string{"rdmaservices", "kc"},
			wantHeader: []string{"NAME", "READY", "NODES", "CAPACITY", "ALLOCATED", "OPEN", "AGE"},
			wantRow:    []string{"kc", "True", "1/1", "64", "8", "5"},
		},
		{
			args:       []string{"rdmaservices", "kc", "-o", "wide"},
			wantHeader: []string{"NAME", "READY", "NODES", "CAPACITY", "ALLOCATED", "OPEN", "PROGRESSING", "CONFLICT", "RESOURCE", "AGE"},
			wantRow:    []string{"kc", "True", "1/1", "64", "8", "5", "False", "False", "rdmavisor.io/vconn"},
		},
		{
			args:       []string{"rdmanodes", "kc-1"},
			wantHeader: []string{"NAME", "READY", "PROVIDER", "DEVICES", "ALLOCATED", "OPEN", "QPS", "ADDRESS", "AGE"},
			wantRow:    []string{"kc-1", "True", "soft", "soft0", "8", "5", "2", "10.0.0.1"},
		},
		{
			args:       []string{"rdmanodes", "kc-1", "-o", "wide"},
			wantHeader: []string{"NAME", "READY", "PROVIDER", "DEVICES", "ALLOCATED", "OPEN", "CAPACITY", "QPS", "ADDRESS", "PORT", "SERVICE", "AGE"},
			wantRow:    []string{"kc-1", "True", "soft", "soft0", "8", "5", "64", "2", "10.0.0.1", "7471", "kc"},
		},
		{
			// The short name and the selectable field work too.
			args:       []string{"rdmanode", "--field-selector", "spec.serviceName=kc"},
			wantHeader: []string{"NAME", "READY", "PROVIDER", "DEVICES", "ALLOCATED", "OPEN", "QPS", "ADDRESS", "AGE"},
			wantRow:    []string{"kc-1", "True", "soft", "soft0", "8", "5", "2", "10.0.0.1"},
		},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			header, rows := kubectlTable(t, kubeconfig, tt.args...)
			if !slices.Equal(header, tt.wantHeader) {
				t.Errorf("header %q, want %q", header, tt.wantHeader)
			}
			if len(rows) != 1 {
				t.Fatalf("rows %q, want one", rows)
			}
			row := rows[0]
			if len(row) != len(tt.wantHeader) || !slices.Equal(row[:len(row)-1], tt.wantRow) {
				t.Errorf("row %q, want %q and an age", row, tt.wantRow)
			}
		})
	}
}

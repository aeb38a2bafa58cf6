package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
)

// TestRun runs the operator as main does, against envtest: it becomes
// leader, serves its probes, renders an RDMAService and stops on SIGTERM.
func TestRun(t *testing.T) {
	env, cfg, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kubeconfig, err := testenv.WriteKubeconfig(env, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	k8s, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "rdmavisor-test"
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}

	probeAddr, metricsAddr := freeAddr(t), freeAddr(t)
	args := os.Args
	t.Cleanup(func() { os.Args = args })
	os.Args = []string{"operator", "--namespace=" + ns, "--metrics-bind-address=" + metricsAddr,
		"--health-probe-bind-address=" + probeAddr, "--agent-image=example.test/agent:1"}
	done := make(chan error, 1)
	go func() { done <- run() }()

	poll(t, "the operator is ready", func() error {
		select {
		case err := <-done:
			t.Fatalf("the operator stopped: %v", err)
		default:
		}
		resp, err := http.Get("http://" + probeAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz: %s", resp.Status)
		}
		return nil
	})
	poll(t, "the operator holds the leader lease", func() error {
		return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "operator.rdmavisor.io"}, &coordinationv1.Lease{})
	})
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: "wiring"}}
	if err := k8s.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	poll(t, "the DaemonSet is rendered with the default image", func() error {
		ds := &appsv1.DaemonSet{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "rdmavisor-agent-wiring"}, ds); err != nil {
			return err
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != "example.test/agent:1" {
			return fmt.Errorf("image %s", img)
		}
		return nil
	})

	checkMetricsAuth(ctx, t, cfg, k8s, ns, metricsAddr)

	// The signal handler of run() owns SIGTERM now.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the operator did not stop on SIGTERM")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func poll(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkMetricsAuth: the metrics endpoint serves HTTPS, refuses a client
// without a token (401) and one whose token the API server authenticates
// but RBAC does not allow get on /metrics (403), and serves one it does.
func checkMetricsAuth(ctx context.Context, t *testing.T, cfg *rest.Config, k8s client.Client, ns, addr string) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(name string) string {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		if err := k8s.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reader, stranger := token("scraper"), token("stranger")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-test"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}}}
	for _, o := range []client.Object{role, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The certificate is self-signed: what is checked is the auth.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(token string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	for _, c := range []struct {
		who, token string
		want       int
	}{{"no token", "", http.StatusUnauthorized}, {"a stranger", stranger, http.StatusForbidden}, {"the reader", reader, http.StatusOK}} {
		poll(t, "metrics for "+c.who, func() error {
			code, body, err := get(c.token)
			if err != nil {
				return err
			}
			if code != c.want {
				return fmt.Errorf("status %d, want %d", code, c.want)
			}
			if code == http.StatusOK && !strings.Contains(body, "controller_runtime_reconcile_total") {
				return fmt.Errorf("no controller_runtime_reconcile_total in\n%s", body)
			}
			return nil
		})
	}
}

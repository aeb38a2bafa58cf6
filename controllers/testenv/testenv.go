// Package testenv starts a real etcd and kube-apiserver (controller-runtime's
// envtest) with the RDMAvisor CRDs installed, for the tests of the API and the
// operator. The binaries are built from source by hack/envtest.sh; hack/test.sh
// points KUBEBUILDER_ASSETS at them.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// ErrNoAssets is returned by Start when KUBEBUILDER_ASSETS is not set.
var ErrNoAssets = errors.New("KUBEBUILDER_ASSETS is not set: these tests need etcd and kube-apiserver; " +
	"run them with hack/test.sh (or make test), or export KUBEBUILDER_ASSETS=$(hack/envtest.sh)")

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Scheme has the built-in types and the RDMAvisor API.
func Scheme() *k8sruntime.Scheme {
	s := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Start starts the control plane with the generated CRDs installed. Stop the
// returned environment when done.
func Start() (*envtest.Environment, *rest.Config, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, nil, ErrNoAssets
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
		// Two cores are shared by parallel test packages: allow a slow start.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting envtest with KUBEBUILDER_ASSETS=%s: %w", os.Getenv("KUBEBUILDER_ASSETS"), err)
	}
	return env, cfg, nil
}

// Kubectl returns the kubectl binary next to the control plane binaries.
func Kubectl() string { return filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl") }

// WriteKubeconfig writes a kubeconfig of an admin user of env into dir and
// returns its path.
func WriteKubeconfig(env *envtest.Environment, dir string) (string, error) {
	user, err := env.AddUser(envtest.User{Name: "test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("adding a kubectl user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("rendering kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", fmt.Errorf("writing kubeconfig: %w", err)
	}
	return path, nil
}

package rdmanode

import (
	"errors"
	"fmt"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// New returns the discovery and reporter of an agent in Kubernetes mode,
// talking to the API server from inside the cluster (or $KUBECONFIG).
func New(cfg *config.AgentConfig, log logr.Logger) (*Discovery, *Reporter, error) {
	if cfg.NodeName == "" || cfg.ServiceName == "" {
		return nil, nil, errors.New("rdmanode: Kubernetes discovery needs the node name ($NODE_NAME or --node-name) and serviceName in the config")
	}
	rc, err := ctrlconfig.GetConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("rdmanode: API server config: %w", err)
	}
	s := k8sruntime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, nil, err
	}
	c, err := client.NewWithWatch(rc, client.Options{Scheme: s})
	if err != nil {
		return nil, nil, fmt.Errorf("rdmanode: API client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("rdmanode: API clientset: %w", err)
	}
	log = log.WithName("rdmanode")
	d := &Discovery{Client: c, Service: cfg.ServiceName, Self: cfg.NodeName, Log: log}
	r := &Reporter{Client: c, Kube: kube, Node: cfg.NodeName, Service: cfg.ServiceName, Provider: v1alpha1.Provider(cfg.Device.Provider), Log: log}
	return d, r, nil
}

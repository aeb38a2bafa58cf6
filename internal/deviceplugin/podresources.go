package deviceplugin

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is the kubelet's pod-resources socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// PodResources lists, for every container of every pod the kubelet runs,
// the IDs of the devices of one resource it holds. Tests replace it.
type PodResources interface {
	// Devices returns one Held per container holding any.
	Devices(ctx context.Context, resourceName string) ([]Held, error)
}

// Held is what one container holds of a resource: its device IDs, and
// its pod, "namespace/name" (the agent ties the allocation, and so the
// pod's vconn addresses, to it).
type Held struct {
	Pod string
	IDs []string
}

// PodResourcesClient is the PodResources of the kubelet pod-resources API
// (v1) on a unix socket.
type PodResourcesClient struct {
	conn *grpc.ClientConn
	c    podresourcesv1.PodResourcesListerClient
}

// NewPodResourcesClient prepares a client of the socket at path; it
// connects on first use and reconnects after a kubelet restart.
func NewPodResourcesClient(path string) (*PodResourcesClient, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod resources %s: %w", path, err)
	}
	return &PodResourcesClient{conn: conn, c: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// Close closes the connection.
func (p *PodResourcesClient) Close() error { return p.conn.Close() }

// Devices lists the containers' devices of resourceName.
func (p *PodResourcesClient) Devices(ctx context.Context, resourceName string) ([]Held, error) {
	rep, err := p.c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("pod resources: list: %w", err)
	}
	var out []Held
	for _, pod := range rep.GetPodResources() {
		for _, c := range pod.GetContainers() {
			var ids []string
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resourceName {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
			if len(ids) > 0 {
				out = append(out, Held{Pod: pod.GetNamespace() + "/" + pod.GetName(), IDs: ids})
			}
		}
	}
	return out, nil
}

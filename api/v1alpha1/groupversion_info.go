// Package v1alpha1 holds the rdmavisor.io/v1alpha1 API: RDMAService, which an
// administrator writes to run RDMAvisor on a set of nodes, and RDMANode, which
// each node agent writes to report its devices, load and health.
//
// Validation lives in the schema (OpenAPI markers and CEL rules), so the API
// server rejects a bad object itself and no webhook is needed.
//
// +kubebuilder:object:generate=true
// +groupName=rdmavisor.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of the objects in this package.
	GroupVersion = schema.GroupVersion{Group: "rdmavisor.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

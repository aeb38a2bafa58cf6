package controllers

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// ReasonInvalidSpec: the operator refuses to run agents for the service (its
// Ready and Degraded conditions say why). The CRD's schema refuses the same
// specs; an object stored before a rule existed, or written past the
// schema, still reaches the operator, which must not act on it.
const ReasonInvalidSpec = "InvalidSpec"

// resourceNameRE is the CRD's rule on spec.resourceName.
var resourceNameRE = regexp.MustCompile(`^` + regexp.QuoteMeta(v1alpha1.ResourceDomain) + `/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// agentRequestBounds are the CRD's bounds on what an agent pod requests.
var agentRequestBounds = map[corev1.ResourceName]resource.Quantity{
	corev1.ResourceCPU:    resource.MustParse(v1alpha1.MaxAgentCPURequest),
	corev1.ResourceMemory: resource.MustParse(v1alpha1.MaxAgentMemoryRequest),
}

// validateSpec repeats the schema's rules whose breach would harm other
// tenants of the nodes: a resourceName outside RDMAvisor's domain (its device
// plugin would take the resource over), agent resources that would
// preempt tenant pods at the agent's priority (system-node-critical), and
// limits the agents would refuse (validateLimits).
func validateSpec(s *v1alpha1.RDMAServiceSpec) error {
	var errs []error
	name := s.ResourceName
	if name == "" {
		name = v1alpha1.DefaultResourceName
	}
	if !resourceNameRE.MatchString(name) {
		errs = append(errs, fmt.Errorf("spec.resourceName %q is not %s/<name>: the device plugin would take over another domain's resource on every selected node", name, v1alpha1.ResourceDomain))
	}
	if r := s.Agent.Resources; r != nil {
		for _, l := range []corev1.ResourceList{r.Requests, r.Limits} {
			for _, k := range slices.Sorted(maps.Keys(l)) {
				if _, ok := agentRequestBounds[k]; !ok {
					errs = append(errs, fmt.Errorf("spec.agent.resources names %s: only cpu and memory, since at the agent's priority a request for anything else preempts the tenant pods holding it", k))
				}
			}
		}
		if len(r.Claims) > 0 {
			errs = append(errs, errors.New("spec.agent.resources has claims: only cpu and memory"))
		}
		for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			// The API server makes a limit without a request the request.
			q, ok := r.Requests[k]
			if !ok {
				q, ok = r.Limits[k]
			}
			if max := agentRequestBounds[k]; ok && q.Cmp(max) > 0 {
				errs = append(errs, fmt.Errorf("the agent requests %s of %s, more than %s: at its priority (system-node-critical) the scheduler preempts tenant pods to fit it", q.String(), k, max.String()))
			}
		}
	}
	errs = append(errs, validateLimits(s.Limits)...)
	return errors.Join(errs...)
}

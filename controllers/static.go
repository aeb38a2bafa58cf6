package controllers

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// The objects below are installed once per cluster, by the chart
// (charts/rdmavisor/templates/agent-rbac.yaml, which charts/chart_test.go
// checks against these functions), not by the operator: an operator that
// could write ClusterRoles or admission policies could grant anyone
// anything it holds and lift any policy. The operator only binds
// AgentClusterRole to the service account of each RDMAService's agents,
// and OperatorBindingsPolicy confines it to exactly those bindings. Their
// names are fixed, like the CRDs': one installation per cluster.
const (
	// AgentClusterRole names the ClusterRole of every RDMAService's agents.
	// The operator holds bind on it, and on no other role.
	AgentClusterRole = "rdmavisor-agent"
	// AgentPolicy names the admission policy (and its binding) that
	// confines every agent to its own RDMANode.
	AgentPolicy = "rdmavisor-agent"
	// AgentSlicePolicy names the admission policy (and its binding) that
	// confines every agent's DRA driver to its own node's ResourceSlices.
	AgentSlicePolicy = "rdmavisor-agent-resourceslices"
	// OperatorBindingsPolicy names the admission policy (and its binding)
	// that confines the operator's ClusterRoleBinding writes.
	OperatorBindingsPolicy = "rdmavisor-operator-bindings"
	// ServicePolicy names the admission policy (and its binding) that
	// reserves the RDMAService fields that decide what runs as root on
	// which nodes to the users and groups the chart's values allow.
	ServicePolicy = "rdmavisor-service-fields"
)

// agentUserPrefix is the start of the user name of every agent service
// account: the rest is the name of the agents' RDMAService (objectName).
func agentUserPrefix(namespace string) string {
	return "system:serviceaccount:" + namespace + ":" + agentObjectPrefix
}

// AgentRules are what an agent needs: its RDMANode (create, update), every
// RDMANode (read, for peer discovery) and certificate requests (create, and
// get to wait for the signature) for its node certificate; Events on the
// pods it allocates vconns to (no reads); and what its pod's
// DRA driver needs (spec.allocation DRA or Both): its node's ResourceSlice
// (written, and watched for changes), the claims it prepares and its Node
// (the slice's owner); and every Pod (list, watch), whose IPs and nodes
// say where a vconn dial goes (agent.PodAddresses); and every
// NetworkPolicy and Namespace (list, watch), which vconn dials obey
// (agent.Policy). RBAC cannot restrict writes to one object by the
// caller's node: the agent policy does that for RDMANodes, and the
// CertSigner for certificates (it signs only for the node the requester's
// token is bound to).
func AgentRules() []rbacv1.PolicyRule {
	group := v1alpha1.GroupVersion.Group
	return []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{"rdmanodes"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch"}},
		{APIGroups: []string{group}, Resources: []string{"rdmanodes/status"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get"}},
		// Events on the pods whose vconns the agent allocates.
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		// Which node runs a pod IP (agent.PodAddresses): the API server's
		// word, not the peer agents'.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		// The cluster's NetworkPolicies and namespaces' labels, which
		// vconn dials are checked against (agent.Policy).
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}},
		// /metrics over TLS (internal/metricsauth): reviews of the callers,
		// and the cluster's client CA.
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"extension-apiserver-authentication"}, Verbs: []string{"get"}},
	}
}

// NewAgentClusterRole returns the agents' ClusterRole.
func NewAgentClusterRole() *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: AgentClusterRole},
		Rules:      AgentRules(),
	}
}

// newPolicy is a policy that fails closed, for the ops on resources of
// group made by requests that meet match; the caller adds its variables and
// validations.
func newPolicy(name, group string, resources []string, match admissionregistrationv1.MatchCondition, ops ...admissionregistrationv1.OperationType) *admissionregistrationv1.ValidatingAdmissionPolicy {
	fail := admissionregistrationv1.Fail
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: ops,
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: resources},
				},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{match},
		},
	}
}

// NewAgentPolicy confines the agents of every RDMAService whose objects live
// in namespace: a request from an agent's service account may create or
// update only the RDMANode named after the node its token is bound to (the
// kubelet-issued token carries the node name as a user extra), and only with
// spec.serviceName set to the agent's own service, which its user name
// carries.
func NewAgentPolicy(namespace string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	prefix := agentUserPrefix(namespace)
	nodeExtra := fmt.Sprintf("request.userInfo.extra[%q]", nodeNameExtra)
	policy := newPolicy(AgentPolicy, v1alpha1.GroupVersion.Group, []string{"rdmanodes", "rdmanodes/status"},
		admissionregistrationv1.MatchCondition{Name: "agent", Expression: fmt.Sprintf("request.userInfo.username.startsWith(%q)", prefix)},
		admissionregistrationv1.Create, admissionregistrationv1.Update)
	policy.Spec.Variables = []admissionregistrationv1.Variable{
		{Name: "service", Expression: fmt.Sprintf("request.userInfo.username.substring(size(%q))", prefix)},
		{Name: "nodeName", Expression: fmt.Sprintf("has(request.userInfo.extra) && %q in request.userInfo.extra && size(%s) == 1 ? %s[0] : ''",
			nodeNameExtra, nodeExtra, nodeExtra)},
	}
	policy.Spec.Validations = []admissionregistrationv1.Validation{
		{
			Expression: "variables.nodeName != '' && object.metadata.name == variables.nodeName",
			Message:    "an RDMAvisor agent may write only the RDMANode of its own node",
			MessageExpression: "variables.nodeName == '' ? 'an RDMAvisor agent may write only the RDMANode of its own node, and its token names no node' : " +
				"'the RDMAvisor agent on node ' + variables.nodeName + ' may write only RDMANode ' + variables.nodeName + ', not ' + object.metadata.name",
			Reason: new(metav1.StatusReasonForbidden),
		},
		{
			Expression:        "object.spec.serviceName == variables.service",
			Message:           "the agents of an RDMAService may write only RDMANodes with their service's spec.serviceName",
			MessageExpression: "'agents of RDMAService ' + variables.service + ' may write only RDMANodes with spec.serviceName ' + variables.service",
			Reason:            new(metav1.StatusReasonForbidden),
		},
	}
	return policy, policyBinding(AgentPolicy)
}

// NewAgentSlicePolicy confines the DRA drivers in the agent pods of every
// RDMAService whose objects live in namespace, which write ResourceSlices
// with the agents' service account: a request from it may create, update or
// delete only a ResourceSlice of the node its token is bound to
// (spec.nodeName, before and after), as NodeRestriction confines a kubelet.
func NewAgentSlicePolicy(namespace string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	prefix := agentUserPrefix(namespace)
	nodeExtra := fmt.Sprintf("request.userInfo.extra[%q]", nodeNameExtra)
	policy := newPolicy(AgentSlicePolicy, "resource.k8s.io", []string{"resourceslices"},
		admissionregistrationv1.MatchCondition{Name: "agent", Expression: fmt.Sprintf("request.userInfo.username.startsWith(%q)", prefix)},
		admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete)
	policy.Spec.Variables = []admissionregistrationv1.Variable{
		{Name: "nodeName", Expression: fmt.Sprintf("has(request.userInfo.extra) && %q in request.userInfo.extra && size(%s) == 1 ? %s[0] : ''",
			nodeNameExtra, nodeExtra, nodeExtra)},
	}
	policy.Spec.Validations = []admissionregistrationv1.Validation{{
		// On DELETE object is null, on CREATE oldObject.
		Expression: "variables.nodeName != '' && " +
			"(object == null || has(object.spec.nodeName) && object.spec.nodeName == variables.nodeName) && " +
			"(oldObject == null || has(oldObject.spec.nodeName) && oldObject.spec.nodeName == variables.nodeName)",
		Message: "an RDMAvisor agent may write only the ResourceSlices of its own node",
		MessageExpression: "variables.nodeName == '' ? 'an RDMAvisor agent may write only the ResourceSlices of its own node, and its token names no node' : " +
			"'the RDMAvisor agent on node ' + variables.nodeName + ' may write only ResourceSlices of node ' + variables.nodeName",
		Reason: new(metav1.StatusReasonForbidden),
	}}
	return policy, policyBinding(AgentSlicePolicy)
}

// NewOperatorBindingsPolicy confines the ClusterRoleBinding writes of the
// operator, user operatorUser, to the bindings it renders: each named after
// an RDMAService's agents, of AgentClusterRole, to that service account in
// namespace. RBAC alone would let it bind AgentClusterRole (on which it holds
// bind) or any role whose permissions it holds to anyone, and delete any
// binding: create and delete cannot be restricted by name.
func NewOperatorBindingsPolicy(namespace, operatorUser string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	prefix := agentObjectPrefix
	policy := newPolicy(OperatorBindingsPolicy, rbacv1.GroupName, []string{"clusterrolebindings"},
		admissionregistrationv1.MatchCondition{Name: "operator", Expression: fmt.Sprintf("request.userInfo.username == %q", operatorUser)},
		admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete)
	policy.Spec.Validations = []admissionregistrationv1.Validation{{
		// On DELETE object is null: the name is oldObject's.
		Expression: fmt.Sprintf("request.operation == 'DELETE' ? oldObject.metadata.name.startsWith(%q) : "+
			"object.metadata.name.startsWith(%q) && object.roleRef.kind == 'ClusterRole' && object.roleRef.name == %q && "+
			"has(object.subjects) && size(object.subjects) == 1 && object.subjects[0].kind == 'ServiceAccount' && "+
			"object.subjects[0].namespace == %q && object.subjects[0].name == object.metadata.name",
			prefix, prefix, AgentClusterRole, namespace),
		Message: fmt.Sprintf("the RDMAvisor operator may write only ClusterRoleBindings %s<service> of ClusterRole %s to ServiceAccount %s/%s<service>",
			prefix, AgentClusterRole, namespace, prefix),
		Reason: new(metav1.StatusReasonForbidden),
	}}

	return policy, policyBinding(OperatorBindingsPolicy)
}

// NewServicePolicy refuses an RDMAService create or update that sets or
// changes spec.agent.image to anything but defaultImage (the operator's own)
// or spec.tolerations, unless the requester is one of users or in one of
// groups. The agent image runs as root on every node the service selects
// (privileged with ibverbs), and tolerations take it onto nodes tainted to
// keep workloads off (control planes): whoever may set either may run any
// code as root there. A field left as it was passes, so other users may
// still edit the rest of a service an administrator made.
func NewServicePolicy(defaultImage string, users, groups []string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	policy := newPolicy(ServicePolicy, v1alpha1.GroupVersion.Group, []string{"rdmaservices"},
		admissionregistrationv1.MatchCondition{Name: "not-allowed", Expression: fmt.Sprintf("!(request.userInfo.username in %s || (has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in %s)))", celList(users), celList(groups))},
		admissionregistrationv1.Create, admissionregistrationv1.Update)
	policy.Spec.Variables = []admissionregistrationv1.Variable{
		{Name: "image", Expression: "has(object.spec.agent) && has(object.spec.agent.image) ? object.spec.agent.image : ''"},
		{Name: "oldImage", Expression: "oldObject != null && has(oldObject.spec.agent) && has(oldObject.spec.agent.image) ? oldObject.spec.agent.image : ''"},
		{Name: "tolerations", Expression: "has(object.spec.tolerations) ? object.spec.tolerations : []"},
		{Name: "oldTolerations", Expression: "oldObject != null && has(oldObject.spec.tolerations) ? oldObject.spec.tolerations : []"},
	}
	policy.Spec.Validations = []admissionregistrationv1.Validation{
		{
			Expression: fmt.Sprintf("variables.image == variables.oldImage || variables.image == '' || variables.image == %q", defaultImage),
			Message:    "spec.agent.image runs as root on every node the RDMAService selects: only the users and groups the rdmavisor chart's rdmaServicePolicy allows may set it",
			Reason:     new(metav1.StatusReasonForbidden),
		},
		{
			Expression: "variables.tolerations == variables.oldTolerations",
			Message:    "spec.tolerations put a root agent onto tainted nodes: only the users and groups the rdmavisor chart's rdmaServicePolicy allows may set them",
			Reason:     new(metav1.StatusReasonForbidden),
		},
	}
	return policy, policyBinding(ServicePolicy)
}

// celList is ss as a CEL list of strings.
func celList(ss []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q", s)
	}
	b.WriteByte(']')
	return b.String()
}

func policyBinding(name string) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}

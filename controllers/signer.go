package controllers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/rdmavisor/rdmavisor/internal/pki"
)

const (
	// SignerName is the signer of agents' certificate requests.
	SignerName = "rdmavisor.io/agent"
	// CAName names the Secret holding the cluster CA and key, and the
	// ConfigMap publishing its certificate (ca.crt) to the agents, in the
	// operator's namespace.
	CAName = "rdmavisor-ca"
	// CABundleKey is the trust bundle's key in the CA ConfigMap.
	CABundleKey = "ca.crt"
	// NodeCertTTL is how long a node certificate lives; agents renew at
	// two thirds of it.
	NodeCertTTL = 24 * time.Hour
	caTTL       = 10 * 365 * 24 * time.Hour
	// ReasonAddressNotUnique denies a request naming an address that
	// another node has too.
	ReasonAddressNotUnique = "AddressNotUnique"
	// indexNodeAddress indexes cached Nodes by their IP addresses.
	indexNodeAddress = "status.addresses.ip"
)

// CertSigner approves and signs agents' certificate requests: each agent
// asks for a certificate of its own node, with its service account token,
// which binds the request to the node its pod runs on. A request is
// signed only when it comes from an agent service account the operator
// rendered, from a pod on the node it names, for addresses that node has.
type CertSigner struct {
	client.Client
	// API reads Nodes uncached: the cache strips their status, which holds
	// their addresses.
	API       client.Reader
	Namespace string
}

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=rdmavisor.io/agent,verbs=approve;sign
// +kubebuilder:rbac:groups="",namespace=rdmavisor-system,resources=secrets,verbs=get;list;watch;create

// Reconcile handles one certificate request of this signer.
func (s *CertSigner) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := s.Get(ctx, req.NamespacedName, csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != SignerName || len(csr.Status.Certificate) > 0 || decided(csr, certificatesv1.CertificateDenied) ||
		decided(csr, certificatesv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("csr", csr.Name, "requester", csr.Spec.Username)
	node, ips, err := s.check(ctx, csr)
	if err != nil {
		log.Info("Denying an agent certificate request", "reason", err.Error())
		return ctrl.Result{}, s.decide(ctx, csr, certificatesv1.CertificateDenied, "NotAnAgentOfThisNode", err.Error())
	}
	if held, err := s.heldElsewhere(ctx, csr.Spec.Request, node); err != nil {
		return ctrl.Result{}, err
	} else if held != "" {
		log.Info("Denying an agent certificate request", "reason", held)
		return ctrl.Result{}, s.decide(ctx, csr, certificatesv1.CertificateDenied, ReasonAddressNotUnique, held)
	}
	ca, err := EnsureCA(ctx, s.Client, s.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	ttl := NodeCertTTL
	if e := csr.Spec.ExpirationSeconds; e != nil && time.Duration(*e)*time.Second < ttl {
		ttl = time.Duration(*e) * time.Second
	}
	cert, err := ca.SignCSR(csr.Spec.Request, node, ips, ttl)
	if err != nil {
		log.Info("Denying an agent certificate request", "reason", err.Error())
		return ctrl.Result{}, s.decide(ctx, csr, certificatesv1.CertificateDenied, "BadRequest", err.Error())
	}
	if !decided(csr, certificatesv1.CertificateApproved) {
		if err := s.decide(ctx, csr, certificatesv1.CertificateApproved, "AgentOfThisNode",
			fmt.Sprintf("agent on node %s", node)); err != nil {
			return ctrl.Result{}, err
		}
	}
	csr.Status.Certificate = cert
	if err := s.Status().Update(ctx, csr); err != nil {
		return ctrl.Result{}, fmt.Errorf("signing %s: %w", csr.Name, err)
	}
	log.Info("Signed an agent certificate", "node", node, "addresses", ips, "ttl", ttl)
	return ctrl.Result{}, nil
}

// check returns the node a request may have a certificate for, and that
// node's addresses, or why it may not.
func (s *CertSigner) check(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (string, []net.IP, error) {
	prefix := "system:serviceaccount:" + s.Namespace + ":"
	sa, ok := strings.CutPrefix(csr.Spec.Username, prefix)
	if !ok {
		return "", nil, fmt.Errorf("requester %q is not a service account of namespace %s", csr.Spec.Username, s.Namespace)
	}
	acct := &corev1.ServiceAccount{}
	if err := s.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: sa}, acct); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil, fmt.Errorf("service account %s is not an agent's", sa)
		}
		return "", nil, err
	}
	if acct.Labels[labelManagedBy] != FieldOwner || acct.Labels[LabelService] == "" {
		return "", nil, fmt.Errorf("service account %s is not an agent's", sa)
	}
	nodes := csr.Spec.Extra[nodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", nil, errors.New("the request was not made with a pod's service account token (no node name in it)")
	}
	node := &corev1.Node{}
	if err := s.API.Get(ctx, types.NamespacedName{Name: nodes[0]}, node); err != nil {
		return "", nil, fmt.Errorf("node %s: %w", nodes[0], err)
	}
	var ips []net.IP
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			if ip := net.ParseIP(a.Address); ip != nil {
				ips = append(ips, ip)
			}
		}
	}
	return node.Name, ips, nil
}

// heldElsewhere says which address the request names that another node
// also has, or "" when none does. A kubelet writes its own Node's
// addresses, so one node can claim another's: the signer cannot tell which
// holds it, and certifies it for neither. The other nodes' addresses come
// from the cache (indexNodeAddress): a node claiming one long held by
// another is refused at once; only a claim made in the last moments before
// a request may be missed. A request the signer cannot read is left to
// SignCSR to refuse.
func (s *CertSigner) heldElsewhere(ctx context.Context, request []byte, node string) (string, error) {
	b, _ := pem.Decode(request)
	if b == nil {
		return "", nil
	}
	req, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return "", nil
	}
	for _, ip := range req.IPAddresses {
		var nodes corev1.NodeList
		if err := s.List(ctx, &nodes, client.MatchingFields{indexNodeAddress: ip.String()}); err != nil {
			return "", fmt.Errorf("listing the nodes with address %s: %w", ip, err)
		}
		for _, n := range nodes.Items {
			if n.Name != node {
				return fmt.Sprintf("address %s is also node %s's: a node's kubelet writes its addresses, so the signer cannot tell which node holds it, and certifies it for neither", ip, n.Name), nil
			}
		}
	}
	return "", nil
}

// nodeAddresses are a Node's addresses that are IPs, as net.IP.String
// writes them: the keys of indexNodeAddress.
func nodeAddresses(o client.Object) []string {
	var out []string
	for _, a := range o.(*corev1.Node).Status.Addresses {
		if ip := net.ParseIP(a.Address); ip != nil {
			out = append(out, ip.String())
		}
	}
	return out
}

func decided(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func (s *CertSigner) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType, reason, msg string) error {
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastUpdateTime: metav1.Now()})
	if err := s.SubResource("approval").Update(ctx, csr); err != nil {
		return fmt.Errorf("%s %s: %w", t, csr.Name, err)
	}
	return nil
}

// EnsureCA returns the cluster CA from its Secret, making it on first use,
// and publishes its certificate in the CA ConfigMap for the agents.
func EnsureCA(ctx context.Context, c client.Client, namespace string) (*pki.CA, error) {
	key := types.NamespacedName{Namespace: namespace, Name: CAName}
	sec := &corev1.Secret{}
	err := c.Get(ctx, key, sec)
	switch {
	case apierrors.IsNotFound(err):
		ca, err := pki.NewCA("rdmavisor agents", caTTL)
		if err != nil {
			return nil, err
		}
		kp, err := ca.KeyPEM()
		if err != nil {
			return nil, err
		}
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CAName,
			Labels: map[string]string{labelManagedBy: FieldOwner}},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: kp}}
		if err := c.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the CA Secret: %w", err)
		} else if err != nil {
			// Another replica made it first: use that one.
			if err := c.Get(ctx, key, sec); err != nil {
				return nil, err
			}
		}
	case err != nil:
		return nil, fmt.Errorf("reading the CA Secret: %w", err)
	}
	ca, err := pki.LoadCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("CA Secret %s/%s: %w", namespace, CAName, err)
	}
	if err := publishCA(ctx, c, namespace, ca.CertPEM); err != nil {
		return nil, err
	}
	return ca, nil
}

func publishCA(ctx context.Context, c client.Client, namespace string, bundle []byte) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CAName}}
	err := c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	switch {
	case apierrors.IsNotFound(err):
		cm.Labels = map[string]string{labelManagedBy: FieldOwner}
		cm.Data = map[string]string{CABundleKey: string(bundle)}
		if err := c.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publishing the CA: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading the CA ConfigMap: %w", err)
	case cm.Data[CABundleKey] == string(bundle):
		return nil
	}
	cm.Data = map[string]string{CABundleKey: string(bundle)}
	if err := c.Update(ctx, cm); err != nil {
		return fmt.Errorf("publishing the CA: %w", err)
	}
	return nil
}

// SetupWithManager watches the certificate requests of this signer.
func (s *CertSigner) SetupWithManager(mgr ctrl.Manager) error {
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		return ok && csr.Spec.SignerName == SignerName
	})
	// The context only bounds the wait for the Node informer, which the
	// manager starts.
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Node{}, indexNodeAddress, nodeAddresses); err != nil {
		return fmt.Errorf("indexing Nodes by address: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).Named("certsigner").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).
		Complete(s)
}

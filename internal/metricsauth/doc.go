// Package metricsauth puts the agent's /metrics behind the cluster's own
// authentication and authorization, the pattern of kube-rbac-proxy and
// controller-runtime's secure metrics serving (Kubernetes delegated
// authentication and authorization), without k8s.io/apiserver.
//
// Who is allowed: whoever the cluster's RBAC lets "get" the
// nonResourceURL /metrics, typically Prometheus's ServiceAccount bound to
// a metrics-reader ClusterRole:
//
//	rules:
//	- nonResourceURLs: ["/metrics"]
//	  verbs: ["get"]
//
// The agent owns no policy: a caller is authenticated by a TokenReview (a
// bearer token) or by the cluster's client CA (a client certificate), and
// authorized by a SubjectAccessReview; the API server answers both.
//
// Why client certificates too: kubectl users whose kubeconfig holds a
// certificate rather than a token reach the agent through a port-forward
// and present that certificate. It is checked against the client CA the
// API server itself trusts (ConfigMap
// kube-system/extension-apiserver-authentication, key "client-ca-file"),
// re-read periodically so that a rotated CA takes effect without a
// restart.
//
// The server's certificate is self-signed and made in memory: the
// credentials, not the server's identity, are what this package guards,
// and scrapers of pod endpoints do not verify serving certificates.
// Decisions are cached briefly so that a scrape every few seconds costs
// the API server two reviews a minute rather than two per scrape.
package metricsauth

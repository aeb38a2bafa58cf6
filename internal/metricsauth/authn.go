package metricsauth

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// user is an authenticated caller, as a SubjectAccessReview names it.
type user struct {
	name   string
	uid    string
	groups []string
	extra  map[string]authorizationv1.ExtraValue
}

// credential is what a request presents: a verified client certificate
// (user is then known) or a bearer token (to be reviewed).
type credential struct {
	sum   [sha256.Size]byte // of the certificate's DER or of the token
	user  *user
	token string
}

// credential finds the request's credential: a client certificate that
// verifies against the current client CA, else a bearer token. ok is
// false when there is neither.
func (g *Guard) credential(r *http.Request) (c credential, ok bool) {
	if u, raw, ok := g.certUser(r); ok {
		return credential{sum: sha256.Sum256(raw), user: u}, true
	}
	scheme, token, found := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !found || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return credential{}, false
	}
	return credential{sum: sha256.Sum256([]byte(token)), token: token}, true
}

// certUser verifies the peer's certificate for client authentication
// against the current CA (intermediates from the peer's chain) and
// returns its user: CommonName, groups the Organizations and
// system:authenticated, as the API server does.
func (g *Guard) certUser(r *http.Request) (*user, []byte, bool) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil, nil, false
	}
	leaf := r.TLS.PeerCertificates[0]
	ca := g.ca.Load()
	if ca == nil {
		g.log.V(1).Info("client certificate ignored: no client CA", "subject", leaf.Subject.String())
		return nil, nil, false
	}
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         ca.pool,
		Intermediates: inter,
		CurrentTime:   g.now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		g.log.V(1).Info("client certificate refused", "subject", leaf.Subject.String(), "reason", err.Error())
		return nil, nil, false
	}
	// The API server adds system:authenticated to every user it
	// authenticates; a token's review says so, a certificate must too.
	groups := append(slices.Clip(leaf.Subject.Organization), authenticatedGroup)
	u := &user{name: leaf.Subject.CommonName, groups: groups}
	return u, leaf.Raw, true
}

// authenticatedGroup is the group of every authenticated user.
const authenticatedGroup = "system:authenticated"

// reviewToken asks the API server who token is. A nil user with a nil
// error means the token is not authenticated.
func (g *Guard) reviewToken(ctx context.Context, token string) (*user, error) {
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	res, err := g.kube.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	if !res.Status.Authenticated {
		if res.Status.Error != "" {
			g.log.V(1).Info("token not authenticated", "reason", res.Status.Error)
		}
		return nil, nil
	}
	ui := res.Status.User
	u := &user{name: ui.Username, uid: ui.UID, groups: ui.Groups}
	if len(ui.Extra) > 0 {
		u.extra = make(map[string]authorizationv1.ExtraValue, len(ui.Extra))
		for k, v := range ui.Extra {
			u.extra[k] = authorizationv1.ExtraValue(v)
		}
	}
	return u, nil
}

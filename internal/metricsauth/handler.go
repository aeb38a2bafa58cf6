package metricsauth

import (
	"context"
	"fmt"
	"net/http"
	"strings"
)

// needCredentials is the 401 text: what a caller must present.
const needCredentials = "unauthorized: present a bearer token (Authorization: Bearer <token>) " +
	"or a client certificate signed by the cluster's client CA"

// Wrap authenticates and authorizes every request to h whose path is not
// Public, which must come over TLS: a client certificate verified against the cluster's client CA,
// else a bearer token reviewed by a TokenReview (neither, or a token not
// authenticated: 401); then a SubjectAccessReview for the lowercased
// method on the non-resource path (not allowed: 403). A failed review is
// a 500, never an allow. Decisions are cached for TTL (allowed) or
// DeniedTTL (denied).
func (g *Guard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.public[r.URL.Path] {
			h.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil {
			// Plain HTTP (Listen serves the probes so): credentials
			// would cross the network in the clear.
			http.Error(w, "bad request: "+r.URL.Path+" is served over HTTPS only", http.StatusBadRequest)
			return
		}
		cred, ok := g.credential(r)
		if !ok {
			unauthorized(w)
			return
		}
		k := cacheKey{cred: cred.sum, path: r.URL.Path, verb: strings.ToLower(r.Method)}
		d, ok := g.cache.get(k, g.now())
		if !ok {
			var err error
			if d, err = g.decide(r.Context(), cred, k); err != nil {
				g.log.Error(err, "cannot authorize request", "path", k.path, "verb", k.verb)
				http.Error(w, "internal error: cannot authorize the request", http.StatusInternalServerError)
				return
			}
			g.remember(k, d)
		}
		switch d.code {
		case http.StatusOK:
			h.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			unauthorized(w)
		default:
			http.Error(w, d.msg, d.code)
		}
	})
}

// decide authenticates cred (a token by a TokenReview) and authorizes
// its user for k's path and verb.
func (g *Guard) decide(ctx context.Context, cred credential, k cacheKey) (decision, error) {
	u := cred.user
	if u == nil {
		var err error
		if u, err = g.reviewToken(ctx, cred.token); err != nil {
			return decision{}, err
		}
		if u == nil {
			return decision{code: http.StatusUnauthorized}, nil
		}
	}
	allowed, reason, err := g.authorize(ctx, u, k.path, k.verb)
	if err != nil {
		return decision{}, fmt.Errorf("user %q: %w", u.name, err)
	}
	if allowed {
		return decision{code: http.StatusOK}, nil
	}
	msg := fmt.Sprintf("forbidden: user %q may not %s %s", u.name, k.verb, k.path)
	if reason != "" {
		msg += ": " + reason
	}
	g.log.V(1).Info("request forbidden", "user", u.name, "path", k.path, "verb", k.verb, "reason", reason)
	return decision{code: http.StatusForbidden, msg: msg}, nil
}

// remember caches d: an allowed decision for TTL, a denied one for the
// shorter DeniedTTL so that a new RoleBinding takes effect soon.
func (g *Guard) remember(k cacheKey, d decision) {
	ttl := g.denied
	if d.code == http.StatusOK {
		ttl = g.ttl
	}
	g.cache.put(k, d, g.now().Add(ttl))
}

// unauthorized answers 401 with the challenge for a bearer token.
func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
	http.Error(w, needCredentials, http.StatusUnauthorized)
}

package metricsauth

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// authorize asks the API server whether u may verb the non-resource
// path. When not, reason is the authorizer's explanation, if any.
func (g *Guard) authorize(ctx context.Context, u *user, path, verb string) (allowed bool, reason string, err error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   u.name,
		UID:    u.uid,
		Groups: u.groups,
		Extra:  u.extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{
			Path: path,
			Verb: verb,
		},
	}}
	res, err := g.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("subject access review: %w", err)
	}
	if res.Status.EvaluationError != "" {
		g.log.V(1).Info("subject access review evaluation error",
			"user", u.name, "path", path, "verb", verb, "error", res.Status.EvaluationError)
	}
	if res.Status.Allowed && !res.Status.Denied {
		return true, "", nil
	}
	return false, res.Status.Reason, nil
}

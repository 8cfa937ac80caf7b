package auth

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TokenReviewer verifies tokens with the API server's TokenReview API. We
// chose it over verifying JWTs ourselves with the issuer's JWKS: the API
// server is then the one authority on signature, issuer, expiry, audience
// and revocation (a token bound to a deleted Pod or ServiceAccount stops
// working at once), and no key set has to be fetched, cached and rotated by a
// process that scales to zero. Its cost, one API call per distinct token, is
// paid once a minute at most per token thanks to the Authenticator's cache.
type TokenReviewer struct {
	Client kubernetes.Interface
}

// Review implements Reviewer.
func (t TokenReviewer) Review(ctx context.Context, token, audience string) (Review, error) {
	tr, err := t.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Review{}, fmt.Errorf("TokenReview: %w", err)
	}
	return Review{
		Authenticated: tr.Status.Authenticated,
		Username:      tr.Status.User.Username,
		Audiences:     tr.Status.Audiences,
	}, nil
}

// Package auth decides whether a request may act: every door (the HTTP API,
// CloudEvents, POST /) asks it the same question with the credentials it
// found. Two credentials are accepted: the API key, compared in constant
// time, and a Kubernetes-issued service-account token (as Knative Eventing
// sends with authentication-oidc), verified by the API server through a
// TokenReview for our audience and then authorised by its subject.
//
// The network is never trusted: Knative's broker ingress and the
// cluster-local gateway relay requests from any Pod, sandboxes included.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// MinKeyBytes is the shortest API key we accept; anything shorter is
// guessable or a placeholder.
const MinKeyBytes = 16

// KeyVariable names the variable that holds the API key, for details.
const KeyVariable = "PROVISIONER_API_KEY"

// Credentials are what a request carried.
type Credentials struct {
	// Key is the X-API-Key header, or the api_key field of a JSON body for
	// senders that cannot set headers (kn func invoke).
	Key string
	// Token is the bearer token of the Authorization header.
	Token string
}

// FromRequest reads the header credentials of r.
func FromRequest(r *http.Request) Credentials {
	c := Credentials{Key: r.Header.Get("X-API-Key")}
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		c.Token = strings.TrimSpace(h[7:])
	}
	return c
}

// Decision is the answer for one request: Code 0 means allowed.
type Decision struct {
	Code    int    // 0, 401, 403 or 503
	Detail  string // what to fix, for refusals
	Subject string // who was allowed: "api-key" or the token's username
}

// Allowed reports whether the request may go on.
func (d Decision) Allowed() bool { return d.Code == 0 }

func refuse(code int, format string, args ...any) Decision {
	return Decision{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Review is the API server's verdict on a token.
type Review struct {
	Authenticated bool
	Username      string
	Audiences     []string
}

// Reviewer asks the API server about a token (a TokenReview).
type Reviewer interface {
	Review(ctx context.Context, token, audience string) (Review, error)
}

// Settings configure an Authenticator.
type Settings struct {
	Key             string
	Disabled        bool     // development switch, loopback only (checked by config)
	Audience        string   // tokens must be issued for it; empty turns tokens off
	AllowedSubjects []string // system:serviceaccount:<ns>:<name> or <ns>:*
}

// Authenticator decides. It is safe for concurrent use.
type Authenticator struct {
	s          Settings
	keyProblem string
	reviewer   Reviewer
	now        func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]cached
}

type cached struct {
	username string
	until    time.Time
}

// Cache bounds: a verified token is trusted again for at most cacheTTL (and
// never past its expiry), and at most cacheMax tokens are remembered, so a
// flood of distinct tokens cannot grow memory.
const (
	cacheTTL = time.Minute
	cacheMax = 4096
)

// New returns an Authenticator; reviewer may be nil until a client exists.
func New(s Settings, reviewer Reviewer) *Authenticator {
	return &Authenticator{s: s, keyProblem: KeyProblem(s.Key), reviewer: reviewer, now: time.Now, cache: map[[32]byte]cached{}}
}

// FromConfig returns the Authenticator the configuration describes.
func FromConfig(c *config.Config, reviewer Reviewer) *Authenticator {
	return New(Settings{Key: c.APIKey, Disabled: c.AuthDisabled, Audience: c.TokenAudience, AllowedSubjects: c.AllowedSubjects}, reviewer)
}

// KeyProblem says why key cannot be used, or "" when it can. A key that is
// unset, short or an unexpanded template (func.yaml's {{ secret:… }} copied
// into an image literally) fails closed.
func KeyProblem(key string) string {
	switch {
	case key == "":
		return KeyVariable + " is not set"
	case strings.Contains(key, "{{"):
		return KeyVariable + " holds an unexpanded template (it contains \"{{\"); set it from a Secret at deploy time"
	case len(key) < MinKeyBytes:
		return fmt.Sprintf("%s is shorter than %d bytes", KeyVariable, MinKeyBytes)
	}
	return ""
}

// KeyUsable reports whether the API key can authenticate anything.
func (a *Authenticator) KeyUsable() bool { return a.keyProblem == "" }

// KeyProblem says why the configured key is refused ("" when usable).
func (a *Authenticator) KeyProblem() string { return a.keyProblem }

// TokensEnabled reports whether bearer tokens can authenticate.
func (a *Authenticator) TokensEnabled() bool { return a.s.Audience != "" }

// Check decides on c. A key, when present, is judged alone: a wrong key is
// refused even if a token is present too, so a caller learns which one failed.
func (a *Authenticator) Check(ctx context.Context, c Credentials) Decision {
	if a.s.Disabled {
		return Decision{Subject: "anonymous (PROVISIONER_AUTH_DISABLED)"}
	}
	switch {
	case c.Key != "":
		return a.checkKey(c.Key)
	case c.Token != "":
		return a.checkToken(ctx, c.Token)
	case a.keyProblem != "" && !a.TokensEnabled():
		return refuse(http.StatusUnauthorized, "this provisioner accepts no credentials: %s, and bearer tokens are off (AUTH_TOKEN_AUDIENCE is empty)", a.keyProblem)
	case a.keyProblem != "":
		return refuse(http.StatusUnauthorized, "no credentials; send a service-account token for audience %q in Authorization: Bearer (API keys are refused: %s)", a.s.Audience, a.keyProblem)
	case a.TokensEnabled():
		return refuse(http.StatusUnauthorized, "no credentials; send the API key in X-API-Key or a service-account token for audience %q in Authorization: Bearer", a.s.Audience)
	default:
		return refuse(http.StatusUnauthorized, "no credentials; send the API key in the X-API-Key header")
	}
}

func (a *Authenticator) checkKey(key string) Decision {
	if a.keyProblem != "" {
		return refuse(http.StatusUnauthorized, "this provisioner refuses API keys: %s", a.keyProblem)
	}
	// Hashing first makes the comparison's time independent of the length too.
	g, w := sha256.Sum256([]byte(key)), sha256.Sum256([]byte(a.s.Key))
	if subtle.ConstantTimeCompare(g[:], w[:]) != 1 {
		return refuse(http.StatusUnauthorized, "invalid API key")
	}
	return Decision{Subject: "api-key"}
}

// claims are the parts of a JWT we read before asking the API server: they
// let us refuse a token for another audience, or an expired one, without a
// round trip. They are not trusted: the TokenReview verifies the signature,
// issuer, expiry and audience.
type claims struct {
	Audience audience `json:"aud"`
	Expiry   int64    `json:"exp"`
}

type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

func (a *Authenticator) checkToken(ctx context.Context, token string) Decision {
	if !a.TokensEnabled() {
		return refuse(http.StatusUnauthorized, "bearer tokens are not accepted by this provisioner (AUTH_TOKEN_AUDIENCE is empty)")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return refuse(http.StatusUnauthorized, "the bearer token is not a JWT")
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	var cl claims
	if err == nil {
		err = json.Unmarshal(raw, &cl)
	}
	if err != nil {
		return refuse(http.StatusUnauthorized, "the bearer token's claims cannot be read")
	}
	if !slices.Contains(cl.Audience, a.s.Audience) {
		return refuse(http.StatusUnauthorized, "the bearer token is not for this function's audience %q", a.s.Audience)
	}
	now := a.now()
	if cl.Expiry == 0 || !now.Before(time.Unix(cl.Expiry, 0)) {
		return refuse(http.StatusUnauthorized, "the bearer token has expired")
	}

	sum := sha256.Sum256([]byte(token))
	username, ok := a.lookup(sum, now)
	if !ok {
		if a.reviewer == nil {
			return refuse(http.StatusServiceUnavailable, "cannot verify tokens until the Kubernetes API server is reachable; retry shortly")
		}
		rv, err := a.reviewer.Review(ctx, token, a.s.Audience)
		if err != nil {
			return refuse(http.StatusServiceUnavailable, "could not verify the bearer token with the Kubernetes API server; retry: %v", err)
		}
		if !rv.Authenticated || !slices.Contains(rv.Audiences, a.s.Audience) {
			return refuse(http.StatusUnauthorized, "the Kubernetes API server did not accept the bearer token for audience %q (invalid signature, issuer, expiry or audience)", a.s.Audience)
		}
		username = rv.Username
		until := now.Add(cacheTTL)
		if exp := time.Unix(cl.Expiry, 0); exp.Before(until) {
			until = exp
		}
		a.remember(sum, cached{username: username, until: until})
	}
	if !SubjectAllowed(username, a.s.AllowedSubjects) {
		return refuse(http.StatusForbidden, "%q is not allowed to call this function; add it to AUTH_ALLOWED_SUBJECTS", username)
	}
	return Decision{Subject: username}
}

func (a *Authenticator) lookup(sum [32]byte, now time.Time) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.cache[sum]
	if !ok || !now.Before(e.until) {
		return "", false
	}
	return e.username, true
}

func (a *Authenticator) remember(sum [32]byte, e cached) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.cache) >= cacheMax {
		clear(a.cache)
	}
	a.cache[sum] = e
}

// SubjectAllowed matches a username against the allow-list. An entry is a
// service account's username, or system:serviceaccount:<ns>:* for every
// service account of one namespace: the only wildcard.
func SubjectAllowed(username string, allowed []string) bool {
	for _, entry := range allowed {
		if ns, ok := strings.CutSuffix(entry, ":*"); ok {
			rest, found := strings.CutPrefix(username, ns+":")
			if found && strings.HasPrefix(ns, "system:serviceaccount:") && rest != "" && !strings.Contains(rest, ":") {
				return true
			}
			continue
		}
		if username == entry {
			return true
		}
	}
	return false
}

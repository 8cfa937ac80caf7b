// Package auth decides whether a request may act, and as whom: every door
// (the HTTP API, CloudEvents, POST /) asks it the same question with the
// credentials it found and the operation it would run. Two credentials are
// accepted: an API key, compared in constant time, whose name is the
// principal ("default" for PROVISIONER_API_KEY), and a Kubernetes-issued
// service-account token (as Knative Eventing sends with
// authentication-oidc), verified by the API server through a TokenReview
// for our audience, whose subject is the principal once allowed. Each
// principal then runs only the operations PROVISIONER_PRINCIPAL_OPERATIONS
// gives it; PROVISIONER_ADMINS marks those that see every sandbox.
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
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/util/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// MinKeyBytes is the shortest API key we accept; anything shorter is
// guessable or a placeholder.
const MinKeyBytes = 16

// KeyVariable names the variable that holds the API key, for details.
const KeyVariable = "PROVISIONER_API_KEY"

// Credentials are what a request carried.
type Credentials struct {
	// Key is the X-API-Key header.
	Key string
	// Token is the bearer token of the Authorization header.
	Token string
	// DataKey is the api_key field of an event's or a POST / body's JSON
	// data, for senders that cannot set headers (kn func invoke). It is
	// judged only when the request carries neither header: an event with
	// a bearer token came through a Broker (Knative Eventing's OIDC), and
	// whatever its data says was written by whoever sent into the Broker,
	// and copied to every subscriber on the way.
	DataKey string
}

// FromRequest reads the header credentials of r.
func FromRequest(r *http.Request) Credentials {
	c := Credentials{Key: r.Header.Get("X-API-Key")}
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		c.Token = strings.TrimSpace(h[7:])
	}
	return c
}

// Principal is who a request acts as: an API key's name ("default" for
// PROVISIONER_API_KEY) or a verified token's service-account username.
// Sandboxes record the principal that created them; only that principal,
// and the administrators, see them.
type Principal struct {
	Name  string
	Admin bool
	// Identity is the credential's own name (a key's name or a token's
	// username). It differs from Name when PROVISIONER_PRINCIPAL_GROUPS
	// puts it in a group; logs name both.
	Identity string
}

// Decision is the answer for one request: Code 0 means allowed.
type Decision struct {
	Code      int       // 0, 401, 403, 429 or 503
	Detail    string    // what to fix, for refusals
	Principal Principal // who was allowed
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
	Key             string            // PROVISIONER_API_KEY, principal "default"
	Keys            map[string]string // PROVISIONER_API_KEYS: name -> key
	Disabled        bool              // development switch (checked by config)
	Audience        string            // tokens must be issued for it; empty turns tokens off
	AllowedSubjects []string          // system:serviceaccount:<ns>:<name> or <ns>:*
	Admins          []string          // principals that see every sandbox
	// Operations narrows what a principal may run; "*" is every principal
	// not listed. Without an entry (and without "*"), everything but the
	// reap (see mayReap).
	Operations map[string][]string
	// DefaultReaps lets principal "default" reap without an entry: it is
	// the only principal that may create (config's MultiplePrincipals is
	// false), so every sandbox the reap judges is its own.
	DefaultReaps bool
	// Groups maps a member (key name or username) to the group principal
	// it acts as for ownership.
	Groups map[string]string
	// ReviewQPS and ReviewBurst bound the TokenReviews this replica sends
	// (0: 5 per second, bursts of 10).
	ReviewQPS   float64
	ReviewBurst int
}

// Authenticator decides. It is safe for concurrent use.
type Authenticator struct {
	s          Settings
	keyProblem string
	keys       []namedKey
	reviewer   Reviewer
	now        func() time.Time

	// accepted and refused remember TokenReview verdicts by the token's
	// SHA-256, each bounded (least recently used goes first), so that
	// neither a flood of distinct tokens grows memory nor a forged token
	// repeated costs more than one review per refusedTTL.
	accepted, refused *cache.LRUExpireCache
	limiter           *rate.Limiter
	inflight          singleflight.Group
}

type namedKey struct {
	name string
	sum  [32]byte
}

// Cache bounds: a verified token is trusted again for at most acceptedTTL
// (and never past its expiry), a refused one is refused again without a
// review for refusedTTL; at most cacheMax of each are remembered.
const (
	acceptedTTL = time.Minute
	refusedTTL  = 30 * time.Second
	cacheMax    = 4096
	// maxReviewWait is how long a request may queue for the TokenReview
	// limiter before it is refused with 503: a flood of forged tokens gets
	// quick refusals instead of piling up waiting requests.
	maxReviewWait = 500 * time.Millisecond
)

// New returns an Authenticator; reviewer may be nil until a client exists.
func New(s Settings, reviewer Reviewer) *Authenticator {
	a := &Authenticator{s: s, keyProblem: KeyProblem(s.Key), reviewer: reviewer, now: time.Now}
	a.accepted = cache.NewLRUExpireCacheWithClock(cacheMax, clock{a})
	a.refused = cache.NewLRUExpireCacheWithClock(cacheMax, clock{a})
	qps, burst := s.ReviewQPS, s.ReviewBurst
	if qps <= 0 || burst < 1 {
		qps, burst = 5, 10
	}
	a.limiter = rate.NewLimiter(rate.Limit(qps), burst)
	if a.keyProblem == "" {
		a.keys = append(a.keys, namedKey{config.DefaultPrincipal, sha256.Sum256([]byte(s.Key))})
	}
	for _, name := range slices.Sorted(maps.Keys(s.Keys)) {
		if name != config.DefaultPrincipal || s.Key == "" {
			a.keys = append(a.keys, namedKey{name, sha256.Sum256([]byte(s.Keys[name]))})
		}
	}
	return a
}

type clock struct{ a *Authenticator }

func (c clock) Now() time.Time { return c.a.now() }

// FromConfig returns the Authenticator the configuration describes (which
// config.Validate has checked).
func FromConfig(c *config.AuthConfig, reviewer Reviewer) *Authenticator {
	keys, _ := config.ParseAPIKeys(c.APIKeys, "")
	ops, _ := config.ParsePrincipalOperations(c.PrincipalOperations)
	groups, _ := config.ParsePrincipalGroups(c.PrincipalGroups)
	return New(Settings{Key: c.APIKey, Keys: keys, Disabled: c.AuthDisabled, Audience: c.TokenAudience,
		AllowedSubjects: c.AllowedSubjects, Admins: c.Admins, Operations: ops, Groups: groups,
		DefaultReaps: !c.MultiplePrincipals(),
		ReviewQPS:    float64(c.TokenReviewQPS), ReviewBurst: c.TokenReviewBurst}, reviewer)
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

// KeyUsable reports whether any API key can authenticate.
func (a *Authenticator) KeyUsable() bool { return len(a.keys) > 0 }

// KeyProblem says why PROVISIONER_API_KEY is refused ("" when usable).
func (a *Authenticator) KeyProblem() string { return a.keyProblem }

// TokensEnabled reports whether bearer tokens can authenticate.
func (a *Authenticator) TokensEnabled() bool { return a.s.Audience != "" }

// Check decides whether c may run operation (one of config.Operations). A
// key, when present, is judged alone: a wrong key is refused even if a
// token is present too, so a caller learns which one failed. A token is
// judged alone too, whatever key the data carries: a token that fails is
// refused, never retried as the data's key.
func (a *Authenticator) Check(ctx context.Context, c Credentials, operation string) Decision {
	var d Decision
	switch {
	case a.s.Disabled:
		return Decision{Principal: Principal{Name: config.AnonymousPrincipal, Admin: true, Identity: config.AnonymousPrincipal}}
	case c.Key != "":
		d = a.checkKey(c.Key)
	case c.Token != "":
		d = a.checkToken(ctx, c.Token)
	case c.DataKey != "":
		d = a.checkKey(c.DataKey)
	case !a.KeyUsable() && !a.TokensEnabled():
		return refuse(http.StatusUnauthorized, "this provisioner accepts no credentials: %s, and bearer tokens are off (AUTH_TOKEN_AUDIENCE is empty)", a.keyProblem)
	case !a.KeyUsable():
		return refuse(http.StatusUnauthorized, "no credentials; send a service-account token for audience %q in Authorization: Bearer (API keys are refused: %s)", a.s.Audience, a.keyProblem)
	case a.TokensEnabled():
		return refuse(http.StatusUnauthorized, "no credentials; send the API key in X-API-Key or a service-account token for audience %q in Authorization: Bearer", a.s.Audience)
	default:
		return refuse(http.StatusUnauthorized, "no credentials; send the API key in the X-API-Key header")
	}
	if !d.Allowed() {
		return d
	}
	return a.authorize(d.Principal.Name, operation)
}

// authorize decides whether an authenticated principal may run operation:
// by its own name (operations, administrators), then acting as its group.
func (a *Authenticator) authorize(name, operation string) Decision {
	ops, listed := a.s.Operations[name]
	if !listed {
		ops, listed = a.s.Operations["*"]
	}
	if listed && !slices.Contains(ops, operation) {
		return refuse(http.StatusForbidden, "%s may not run %q; PROVISIONER_PRINCIPAL_OPERATIONS allows it only %s",
			name, operation, strings.Join(ops, ", "))
	}
	admin := slices.Contains(a.s.Admins, name)
	if operation == ReapOperation && !listed && !a.mayReap(name, admin) {
		return refuse(http.StatusForbidden, "%s may not run %q: the reap judges every principal's sandboxes, so it is granted only by PROVISIONER_PRINCIPAL_OPERATIONS (an entry for %s, or \"*\", that lists reap), to the administrators (PROVISIONER_ADMINS), and to %q while it is the only principal that may create; ask the operator to grant it, or leave the reap to the PingSource (config/600-pingsource.yaml)",
			name, operation, name, config.DefaultPrincipal)
	}
	owner := name
	if g, ok := a.s.Groups[name]; ok {
		owner = g
	}
	return Decision{Principal: Principal{Name: owner, Admin: admin, Identity: name}}
}

// ReapOperation is the operation a principal must be granted.
const ReapOperation = "reap"

// mayReap says whether a principal that PROVISIONER_PRINCIPAL_OPERATIONS
// does not list may reap. The reap lists and judges every principal's
// sandboxes, and runs the pools' upkeep: with tenants, one that may reap
// makes the replica do work for every tenant on demand, as often as it
// asks. So it is granted where today's deployments need it and nowhere
// else: to the administrators, and to "default" (DeerFlow's
// PROVISIONER_API_KEY) while it is the one tenant. config/'s PingSource
// and reap Trigger are listed with reap; any other principal needs an
// entry that lists it.
func (a *Authenticator) mayReap(name string, admin bool) bool {
	return admin || (name == config.DefaultPrincipal && a.s.DefaultReaps)
}

func (a *Authenticator) checkKey(key string) Decision {
	if len(a.keys) == 0 {
		return refuse(http.StatusUnauthorized, "this provisioner refuses API keys: %s", a.keyProblem)
	}
	// Hashing first makes each comparison's time independent of the length
	// too; every key is compared, so the time does not tell which matched.
	g := sha256.Sum256([]byte(key))
	match := -1
	for i, k := range a.keys {
		if subtle.ConstantTimeCompare(g[:], k.sum[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return refuse(http.StatusUnauthorized, "invalid API key")
	}
	return Decision{Principal: Principal{Name: a.keys[match].name}}
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
	if v, ok := a.refused.Get(sum); ok {
		return refuse(http.StatusUnauthorized, "%s", v.(string))
	}
	username, ok := "", false
	if v, hit := a.accepted.Get(sum); hit {
		username, ok = v.(string), true
	}
	if !ok {
		if a.reviewer == nil {
			return refuse(http.StatusServiceUnavailable, "cannot verify tokens until the Kubernetes API server is reachable; retry shortly")
		}
		// Concurrent requests with one token share one review.
		v, err, _ := a.inflight.Do(string(sum[:]), func() (any, error) { return a.review(ctx, token, sum, cl.Expiry) })
		if err != nil {
			return refuse(http.StatusServiceUnavailable, "%v", err)
		}
		d := v.(Decision)
		if !d.Allowed() {
			return d
		}
		username = d.Principal.Name
	}
	if !SubjectAllowed(username, a.s.AllowedSubjects) {
		return refuse(http.StatusForbidden, "%q is not allowed to call this function; add it to AUTH_ALLOWED_SUBJECTS", username)
	}
	return Decision{Principal: Principal{Name: username}}
}

// review asks the API server about a token, on the TokenReview limiter,
// and remembers the verdict. An error is transient (503); a Decision that
// is not allowed is the API server's refusal, cached for refusedTTL.
func (a *Authenticator) review(ctx context.Context, token string, sum [32]byte, expiry int64) (Decision, error) {
	r := a.limiter.Reserve()
	if d := r.Delay(); d > maxReviewWait {
		r.Cancel()
		return Decision{}, fmt.Errorf("too many new bearer tokens to verify at once (AUTH_TOKEN_REVIEW_QPS); retry in a moment")
	} else if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			r.Cancel()
			return Decision{}, fmt.Errorf("could not verify the bearer token in time: %w", ctx.Err())
		case <-t.C:
		}
	}
	rv, err := a.reviewer.Review(ctx, token, a.s.Audience)
	if err != nil {
		return Decision{}, fmt.Errorf("could not verify the bearer token with the Kubernetes API server; retry: %w", err)
	}
	now := a.now()
	if !rv.Authenticated || !slices.Contains(rv.Audiences, a.s.Audience) {
		detail := fmt.Sprintf("the Kubernetes API server did not accept the bearer token for audience %q (invalid signature, issuer, expiry or audience)", a.s.Audience)
		a.refused.Add(sum, detail, refusedTTL)
		return Decision{Code: http.StatusUnauthorized, Detail: detail}, nil
	}
	ttl := acceptedTTL
	if left := time.Unix(expiry, 0).Sub(now); left < ttl {
		ttl = left
	}
	a.accepted.Add(sum, rv.Username, ttl)
	return Decision{Principal: Principal{Name: rv.Username}}, nil
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

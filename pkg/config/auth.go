package config

import (
	"regexp"
	"strings"
)

// AuthConfig is who may call: API keys and their principals, administrators,
// what each principal may run, groups of principals, and the bearer tokens
// of service accounts (Knative Eventing's OIDC), checked by TokenReview.
type AuthConfig struct {
	APIKey string `envconfig:"PROVISIONER_API_KEY"`
	// APIKeys are named API keys, "name=key,name2=key2": each name is a
	// principal (see principals.go). PROVISIONER_API_KEY is principal "default".
	APIKeys string `envconfig:"PROVISIONER_API_KEYS"`
	// Admins lists the principals that see every sandbox (key names or
	// service-account usernames).
	Admins []string `envconfig:"PROVISIONER_ADMINS"`
	// PrincipalOperations narrows what listed principals may run:
	// "principal=op,op;principal2=op". Unlisted principals may run every
	// operation, unless a "*" entry says otherwise.
	PrincipalOperations string `envconfig:"PROVISIONER_PRINCIPAL_OPERATIONS"`
	// PrincipalGroups makes several credentials one owner:
	// "group=member,member;…". Behind a Knative Broker every event arrives
	// with its Trigger's identity, one per operation; grouped, what the
	// create Trigger made the destroy Trigger can destroy. Operations and
	// administrators are still judged by each member's own name.
	PrincipalGroups string `envconfig:"PROVISIONER_PRINCIPAL_GROUPS"`
	// TokenReviewQPS and TokenReviewBurst bound the TokenReviews a replica
	// sends, on a client of their own: a flood of forged tokens cannot
	// take the rate that sandbox operations use. The honest tokens are few
	// (one per Trigger and PingSource, reused for an hour, each verified
	// once a minute at most), so a few per second is plenty.
	TokenReviewQPS   float32 `envconfig:"AUTH_TOKEN_REVIEW_QPS" default:"5"`
	TokenReviewBurst int     `envconfig:"AUTH_TOKEN_REVIEW_BURST" default:"10"`

	// AuthDisabled accepts every request without credentials. It is a
	// development switch: start-up refuses it unless LISTEN_ADDRESS is a
	// loopback address, and whenever the process runs under Knative
	// (K_SERVICE; queue-proxy reaches the container over loopback) or in a
	// cluster (KUBERNETES_SERVICE_HOST), so a deployed function can never
	// run with it. Config.Validate checks that, as it spans groups.
	AuthDisabled bool `envconfig:"PROVISIONER_AUTH_DISABLED" default:"false"`
	// TokenAudience is the audience a bearer token must be issued for (the
	// Triggers' subscriber.audience, the PingSource's sink.audience). Empty
	// turns bearer tokens off.
	TokenAudience string `envconfig:"AUTH_TOKEN_AUDIENCE"`
	// AllowedSubjects lists the service accounts whose verified tokens may
	// act: system:serviceaccount:<ns>:<name>, or <ns>:* for a whole namespace.
	AllowedSubjects []string `envconfig:"AUTH_ALLOWED_SUBJECTS"`
}

var subjectPattern = regexp.MustCompile(`^system:serviceaccount:[a-z0-9]([-a-z0-9]*[a-z0-9])?:(\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$`)

// Validate checks the subjects, the audience, the keys, the principals and
// the TokenReview rate.
func (c *AuthConfig) Validate() error {
	var p problems
	for _, s := range c.AllowedSubjects {
		if !subjectPattern.MatchString(s) {
			p.bad("AUTH_ALLOWED_SUBJECTS", "%q must be system:serviceaccount:<namespace>:<name> or system:serviceaccount:<namespace>:*", s)
		}
	}
	if c.TokenAudience != "" && strings.ContainsAny(c.TokenAudience, " \t\n,") {
		p.bad("AUTH_TOKEN_AUDIENCE", "%q must be one audience without spaces or commas", c.TokenAudience)
	}
	keys, err := ParseAPIKeys(c.APIKeys, c.APIKey)
	p.join(err) // its errors name PROVISIONER_API_KEYS
	for _, a := range c.Admins {
		if err := validPrincipal(a); err != nil {
			p.bad("PROVISIONER_ADMINS", "%v", err)
		}
	}
	// The parsers' errors name their setting.
	if _, err := ParsePrincipalOperations(c.PrincipalOperations); err != nil {
		p.join(err)
	}
	groups, err := ParsePrincipalGroups(c.PrincipalGroups)
	if err != nil {
		p.join(err)
	} else if err := checkPrincipalNames(keys, groups, c.APIKey); err != nil {
		p.bad("PROVISIONER_PRINCIPAL_GROUPS", "%v", err)
	}
	if c.TokenReviewQPS <= 0 || c.TokenReviewBurst < 1 {
		p.bad("AUTH_TOKEN_REVIEW_QPS", "AUTH_TOKEN_REVIEW_QPS and AUTH_TOKEN_REVIEW_BURST must be positive")
	}
	return p.err()
}

package config

import "time"

// TemplatesConfig is what sandbox templates may do: how long one read is
// reused, the largest warm pool one may ask for, and the allow-lists of
// what one may add beyond the provisioner's own settings (allowlists.go).
type TemplatesConfig struct {
	// TemplateCacheTTL is how long a sandbox template read from the API
	// server is reused before it is read again (and re-validated only when
	// its resourceVersion changed): an edit applies to creates this much later.
	TemplateCacheTTL time.Duration `envconfig:"SANDBOX_TEMPLATE_CACHE_TTL" default:"1s"`
	// MaxPoolSize caps the warm pool a template may ask for
	// (sandbox.deerflow.dev/pool-size): pooled Pods stand Ready with nobody
	// using them, outside MAX_SANDBOXES, so they have a limit of their own.
	MaxPoolSize int `envconfig:"SANDBOX_MAX_POOL_SIZE" default:"10"`

	// What a template may add beyond the provisioner's own settings, each by
	// allow-list (config/800-admission-policy.yaml's parameters must admit
	// the same): tolerations (key[=value]:Effect, as SANDBOX_TOLERATIONS),
	// Pod annotations (exact keys, or prefixes ending in *), and priority
	// classes (none by default).
	TemplateTolerations     []string `envconfig:"SANDBOX_TEMPLATE_TOLERATIONS"`
	TemplateAnnotations     []string `envconfig:"SANDBOX_TEMPLATE_ANNOTATIONS" default:"kubectl.kubernetes.io/default-container,cluster-autoscaler.kubernetes.io/safe-to-evict,prometheus.io/scrape,prometheus.io/port,prometheus.io/path"`
	TemplatePriorityClasses []string `envconfig:"SANDBOX_TEMPLATE_PRIORITY_CLASSES"`
}

// Validate checks the cache's TTL, the pool size and the allow-lists.
func (c *TemplatesConfig) Validate() error {
	var p problems
	if c.TemplateCacheTTL < 0 || c.TemplateCacheTTL > time.Minute {
		p.bad("SANDBOX_TEMPLATE_CACHE_TTL", "%s must be between 0 (read on every create) and 1m", c.TemplateCacheTTL)
	}
	if c.MaxPoolSize < 0 {
		p.bad("SANDBOX_MAX_POOL_SIZE", "%d must be 0 (no pools) or positive", c.MaxPoolSize)
	}
	p = append(p, c.validateTemplateAllowLists()...)
	return p.err()
}

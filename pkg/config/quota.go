package config

// QuotaConfig is how many sandboxes may exist; 0 means no limit.
type QuotaConfig struct {
	MaxSandboxes        int `envconfig:"MAX_SANDBOXES" default:"500"`
	MaxSandboxesPerUser int `envconfig:"MAX_SANDBOXES_PER_USER" default:"0"`
	// MaxSandboxesPerPrincipal limits the sandboxes each principal (API key
	// name or token subject) has created, counted as the per-user limit is.
	MaxSandboxesPerPrincipal int `envconfig:"MAX_SANDBOXES_PER_PRINCIPAL" default:"0"`
	// MaxOwnedIDsPerPrincipal bounds the user and thread ids each
	// principal may own at once (one Lease each, package ownership), so
	// that no principal grows etcd without bound or holds every id it can
	// guess. Only enforced with more than one principal.
	MaxOwnedIDsPerPrincipal int `envconfig:"MAX_OWNED_IDS_PER_PRINCIPAL" default:"5000"`
}

// Validate checks that no quota is negative.
func (c *QuotaConfig) Validate() error {
	var p problems
	if c.MaxSandboxes < 0 || c.MaxSandboxesPerUser < 0 {
		p.bad("MAX_SANDBOXES", "quotas must be 0 (no limit) or positive")
	}
	if c.MaxSandboxesPerPrincipal < 0 {
		p.bad("MAX_SANDBOXES_PER_PRINCIPAL", "must be 0 (no limit) or positive")
	}
	if c.MaxOwnedIDsPerPrincipal < 0 {
		p.bad("MAX_OWNED_IDS_PER_PRINCIPAL", "must be 0 (no limit) or positive")
	}
	return p.err()
}

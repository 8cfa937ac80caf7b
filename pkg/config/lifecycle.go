package config

import "time"

// LifecycleConfig is how long a sandbox lives: its idle timeout and maximum
// lifetime (defaults, and the bounds a request may ask within), how often
// its activity is recorded, and how long a create waits for a terminating
// Pod of the same name.
type LifecycleConfig struct {
	IdleTimeout      time.Duration `envconfig:"SANDBOX_IDLE_TIMEOUT" default:"1h"`
	MaxLifetime      time.Duration `envconfig:"SANDBOX_MAX_LIFETIME" default:"24h"`
	MaxIdleTimeout   time.Duration `envconfig:"SANDBOX_MAX_IDLE_TIMEOUT" default:"24h"`
	MaxMaxLifetime   time.Duration `envconfig:"SANDBOX_MAX_MAX_LIFETIME" default:"168h"`
	ActivityThrottle time.Duration `envconfig:"SANDBOX_ACTIVITY_THROTTLE" default:"1m"`
	TerminatingWait  time.Duration `envconfig:"SANDBOX_TERMINATING_WAIT" default:"20s"`
}

// Validate checks that the timeouts are positive and within their bounds.
func (c *LifecycleConfig) Validate() error {
	var p problems
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"SANDBOX_IDLE_TIMEOUT", c.IdleTimeout}, {"SANDBOX_MAX_LIFETIME", c.MaxLifetime},
		{"SANDBOX_MAX_IDLE_TIMEOUT", c.MaxIdleTimeout}, {"SANDBOX_MAX_MAX_LIFETIME", c.MaxMaxLifetime},
	} {
		if d.v <= 0 {
			p.bad(d.name, "%s must be positive", d.v)
		}
	}
	if c.IdleTimeout > c.MaxIdleTimeout {
		p.bad("SANDBOX_IDLE_TIMEOUT", "%s exceeds SANDBOX_MAX_IDLE_TIMEOUT %s", c.IdleTimeout, c.MaxIdleTimeout)
	}
	if c.MaxLifetime > c.MaxMaxLifetime {
		p.bad("SANDBOX_MAX_LIFETIME", "%s exceeds SANDBOX_MAX_MAX_LIFETIME %s", c.MaxLifetime, c.MaxMaxLifetime)
	}
	if c.MaxLifetime < time.Second {
		p.bad("SANDBOX_MAX_LIFETIME", "%s is under one second", c.MaxLifetime)
	}
	return p.err()
}

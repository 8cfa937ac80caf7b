// Package config holds the provisioner's whole configuration: one struct, read
// once at start-up from the environment (and the func runtime's cfg map), then
// passed down. Nothing else in the program reads the environment.
//
// Config is grouped by concern: each group is a struct of its own (its file
// holds its variables and its validation), embedded in Config without a name.
// envconfig does not prefix an anonymous embedded struct, so every variable
// keeps its name (TestVariableNames pins them), and Go promotes the groups'
// fields, so cfg.Namespace still reads Config's K8S_NAMESPACE.
package config

import (
	"errors"
	"fmt"

	"github.com/kelseyhightower/envconfig"
)

// Config mirrors every variable of DeerFlow's Python provisioner (same names,
// defaults and meanings: K8S_NAMESPACE, SANDBOX_IMAGE, the host paths and
// claims, SANDBOX_CONTAINER_PORT, SANDBOX_SERVICE_TYPE, NODE_HOST,
// KUBECONFIG_PATH, K8S_API_SERVER, PROVISIONER_API_KEY and the Lark images)
// and adds our own hardening, lifecycle and quota knobs.
type Config struct {
	DeerFlowConfig
	AuthConfig
	PodSecurityConfig
	ResourcesConfig
	LifecycleConfig
	QuotaConfig
	IsolationConfig
	TemplatesConfig
	EventsConfig
	ClientConfig
	ServerConfig
}

// Load reads the configuration from the environment and validates it. Every
// error names the variable to fix.
func Load() (*Config, error) {
	var c Config
	if err := envconfig.Process("", &c); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks values that envconfig's types cannot, so that a bad value
// fails start-up instead of the first create: each group's own checks, then
// those that span groups. The errors are joined, one per line.
func (c *Config) Validate() error {
	var p problems
	for _, err := range []error{
		c.DeerFlowConfig.Validate(),
		c.AuthConfig.Validate(),
		c.PodSecurityConfig.Validate(),
		c.ResourcesConfig.Validate(),
		c.LifecycleConfig.Validate(),
		c.QuotaConfig.Validate(),
		c.IsolationConfig.Validate(),
		c.TemplatesConfig.Validate(),
		c.EventsConfig.Validate(),
		c.ClientConfig.Validate(),
		c.ServerConfig.Validate(),
	} {
		p.join(err)
	}
	switch {
	case c.AuthDisabled && c.KService != "":
		p.bad("PROVISIONER_AUTH_DISABLED", "is a development switch and is refused under Knative (K_SERVICE=%q): queue-proxy reaches the container over loopback, so every caller would pass", c.KService)
	case c.AuthDisabled && c.KubernetesServiceHost != "":
		p.bad("PROVISIONER_AUTH_DISABLED", "is a development switch and is refused in a cluster (KUBERNETES_SERVICE_HOST is set): every Pod that reaches this one would pass")
	case c.AuthDisabled && !IsLoopback(c.ListenAddress):
		p.bad("PROVISIONER_AUTH_DISABLED", "is a development switch and needs a loopback LISTEN_ADDRESS (127.0.0.1:8080), not %q", c.ListenAddress)
	}
	return p.err()
}

// problems gathers a validation's errors, each naming its variable.
type problems []error

// bad adds the error "name: message".
func (p *problems) bad(name, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
}

// join adds a group's errors one by one, so that Config.Validate returns one
// flat list, as a single Validate did.
func (p *problems) join(err error) {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		*p = append(*p, joined.Unwrap()...)
	} else if err != nil {
		*p = append(*p, err)
	}
}

// err is the joined errors, or nil for none.
func (p problems) err() error {
	return errors.Join(p...)
}

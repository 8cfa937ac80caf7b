// Package config holds the provisioner's whole configuration: one struct, read
// once at start-up from the environment (and the func runtime's cfg map), then
// passed down. Nothing else in the program reads the environment.
//
// Config is grouped by concern: each group is a struct of its own (its file
// holds its variables and its validation), embedded in Config without a name.
// envconfig does not prefix an anonymous embedded struct, so every variable
// keeps its name (TestVariableNames pins them), and Go promotes the groups'
// fields, so cfg.Namespace still reads Config's K8S_NAMESPACE. A package
// gets only the groups it reads: one group (auth, quota), or Objects, the
// groups sandbox objects are made from.
package config

import (
	"errors"
	"fmt"
	"strings"

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
	FairnessConfig
	IsolationConfig
	TemplatesConfig
	E2BConfig
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
		c.FairnessConfig.Validate(),
		c.IsolationConfig.Validate(),
		c.TemplatesConfig.Validate(),
		c.E2BConfig.Validate(),
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
	c.checkSharedClaims(&p)
	return p.err()
}

// checkSharedClaims refuses the PVC settings under which one principal's
// sandbox could reach another principal's data (issue 29, item 5). With one
// principal (DeerFlow's single key) every setting stays as in DeerFlow.
//   - A skills claim without SKILLS_PVC_SUBPATH_TEMPLATE is mounted whole at
//     /mnt/skills: every user's custom skills, in every tenant's sandbox. A
//     template without {user_id} shares one directory the same way. (The
//     claim is mounted read-only, so no sandbox plants links in it.)
//   - A user-data claim is mounted at a subPath, which the kubelet confines
//     to the claim, not to a tenant's tree in it: a link a sandbox plants in
//     its own writable tree can lead a later mount of its principal into
//     another principal's. Host-path mode roots each volume at the tenant's
//     own directory instead (resources.hostRootOf), which the real-node
//     tests prove link-proof; a shared claim is not proven so, and refused.
func (c *Config) checkSharedClaims(p *problems) {
	if !c.MultiplePrincipals() {
		return
	}
	who, many := c.CreatingPrincipals()
	names := strings.Join(who, ", ")
	if many {
		names += " and every service account of a wildcard subject in AUTH_ALLOWED_SUBJECTS"
	}
	if c.SkillsPVCName != "" && !strings.Contains(c.SkillsPVCSubpathTemplate, "{user_id}") {
		p.bad("SKILLS_PVC_SUBPATH_TEMPLATE", "must be set, with {user_id} in it, while SKILLS_PVC_NAME is and more than one principal may create sandboxes (%s): "+
			"otherwise every sandbox mounts every user's custom skills; set it to each user's directory on the claim "+
			"(for example skills/{user_id}), or configure a single principal", names)
	}
	if c.UserdataPVCName != "" {
		p.bad("USERDATA_PVC_NAME", "is refused while more than one principal may create sandboxes (%s): a subPath on a shared claim is confined "+
			"to the claim, not to a tenant's tree, so a link one tenant plants could lead a later mount into another's data; "+
			"unset it to mount user data from DEER_FLOW_HOST_BASE_DIR (host-path mode, rooted at each tenant's own directory), "+
			"or configure a single principal (PROVISIONER_API_KEY alone, or every creating credential in the group \"default\")", names)
	}
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

package config

// Objects is the part of the configuration that the sandbox objects are
// made from, and that a request is checked against: the image and mounts
// (DeerFlow), Pod security, resources, lifetimes, isolation, templates and
// the namespace. The builders (package resources), the templates, the pools'
// ReplicaSets and the request's validation take it, so none of them reads
// the API keys, the quota, the events or the server's settings. Its groups
// are the Config's own, not copies: Objects reads what the Config holds.
type Objects struct {
	*DeerFlowConfig
	*PodSecurityConfig
	*ResourcesConfig
	*LifecycleConfig
	*IsolationConfig
	*TemplatesConfig
	*ClientConfig
	*E2BConfig
}

// Objects returns the groups of c that sandbox objects are made from.
func (c *Config) Objects() Objects {
	return Objects{&c.DeerFlowConfig, &c.PodSecurityConfig, &c.ResourcesConfig, &c.LifecycleConfig, &c.IsolationConfig, &c.TemplatesConfig, &c.ClientConfig, &c.E2BConfig}
}

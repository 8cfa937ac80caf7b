package config

import "k8s.io/apimachinery/pkg/api/resource"

// ResourcesConfig is what a sandbox Pod requests and may use: defaults as
// DeerFlow's Pod, and the bounds a request may ask within.
type ResourcesConfig struct {
	CPURequest       string `envconfig:"SANDBOX_CPU_REQUEST" default:"100m"`
	CPULimit         string `envconfig:"SANDBOX_CPU_LIMIT" default:"1"`
	MemoryRequest    string `envconfig:"SANDBOX_MEMORY_REQUEST" default:"256Mi"`
	MemoryLimit      string `envconfig:"SANDBOX_MEMORY_LIMIT" default:"1Gi"`
	EphemeralStorage string `envconfig:"SANDBOX_EPHEMERAL_STORAGE" default:"500Mi"`
	MaxCPULimit      string `envconfig:"SANDBOX_MAX_CPU_LIMIT" default:"4"`
	MaxMemoryLimit   string `envconfig:"SANDBOX_MAX_MEMORY_LIMIT" default:"8Gi"`
	// MemoryRequestEqualsLimit requests the memory a sandbox may use, so no
	// sandbox can overcommit its node.
	MemoryRequestEqualsLimit bool `envconfig:"SANDBOX_MEMORY_REQUEST_EQUALS_LIMIT" default:"true"`
}

// Validate checks that every quantity parses and is positive.
func (c *ResourcesConfig) Validate() error {
	var p problems
	for _, q := range []struct{ name, v string }{
		{"SANDBOX_CPU_REQUEST", c.CPURequest}, {"SANDBOX_CPU_LIMIT", c.CPULimit},
		{"SANDBOX_MEMORY_REQUEST", c.MemoryRequest}, {"SANDBOX_MEMORY_LIMIT", c.MemoryLimit},
		{"SANDBOX_EPHEMERAL_STORAGE", c.EphemeralStorage},
		{"SANDBOX_MAX_CPU_LIMIT", c.MaxCPULimit}, {"SANDBOX_MAX_MEMORY_LIMIT", c.MaxMemoryLimit},
	} {
		if qty, err := resource.ParseQuantity(q.v); err != nil || qty.Sign() <= 0 {
			p.bad(q.name, "%q is not a positive quantity", q.v)
		}
	}
	return p.err()
}

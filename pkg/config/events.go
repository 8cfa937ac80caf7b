package config

// EventsConfig is the events side: CloudEvents (and POST /) accepted, from
// which sources, and the Kubernetes Events the provisioner writes.
type EventsConfig struct {
	EventSourceAllowlist []string `envconfig:"EVENT_SOURCE_ALLOWLIST"`
	EventsDisabled       bool     `envconfig:"EVENTS_DISABLED" default:"false"`
	EmitKubernetesEvents bool     `envconfig:"EMIT_KUBERNETES_EVENTS" default:"true"`
	// Events are advice and every one is a write to the shared API server:
	// at most this many per second per replica (bursts of EventsBurst);
	// beyond, they are dropped and counted.
	EventsQPS   float64 `envconfig:"K8S_EVENTS_QPS" default:"1"`
	EventsBurst int     `envconfig:"K8S_EVENTS_BURST" default:"10"`
}

// Validate checks the Kubernetes Events' rate.
func (c *EventsConfig) Validate() error {
	var p problems
	if c.EventsQPS <= 0 || c.EventsBurst < 1 {
		p.bad("K8S_EVENTS_QPS", "K8S_EVENTS_QPS and K8S_EVENTS_BURST must be positive (set EMIT_KUBERNETES_EVENTS=false for none)")
	}
	return p.err()
}

package config

import (
	"net"
	"strings"
	"time"
)

// ServerConfig is the function's own server: where it listens and logs, how
// large and how long a request may be, how many may wait for readiness at
// once, and what the platform tells it about where it runs.
type ServerConfig struct {
	ListenAddress       string `envconfig:"LISTEN_ADDRESS" default:"[::]:8080"`
	LogLevel            string `envconfig:"LOG_LEVEL" default:"info"`
	MaxRequestBodyBytes int64  `envconfig:"MAX_REQUEST_BODY_BYTES" default:"65536"`
	// A request's deadline is REQUEST_TIMEOUT plus the wait it asked for; the
	// two together must fit the func runtime's 30 s write timeout, or the
	// answer is lost (see RuntimeWriteBudget).
	MaxReadyWait   time.Duration `envconfig:"SANDBOX_MAX_READY_WAIT" default:"20s"`
	RequestTimeout time.Duration `envconfig:"REQUEST_TIMEOUT" default:"8s"`
	// MaxConcurrentWaits caps the requests of one replica that wait for
	// readiness at once (each holds an API watch); beyond it, 429.
	MaxConcurrentWaits int `envconfig:"MAX_CONCURRENT_WAITS" default:"32"`
	// KService is set by Knative Serving.
	KService string `envconfig:"K_SERVICE"`
	// KubernetesServiceHost is set by the kubelet in every container.
	KubernetesServiceHost string `envconfig:"KUBERNETES_SERVICE_HOST"`
}

// RuntimeWriteBudget is how long a request may take before the func
// runtime's 30 s write timeout drops its answer, less a margin for writing it.
const RuntimeWriteBudget = 28 * time.Second

// Validate checks the timeouts, the waits, the body limit and the log level.
func (c *ServerConfig) Validate() error {
	var p problems
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"REQUEST_TIMEOUT", c.RequestTimeout}, {"SANDBOX_MAX_READY_WAIT", c.MaxReadyWait},
	} {
		if d.v <= 0 {
			p.bad(d.name, "%s must be positive", d.v)
		}
	}
	if c.RequestTimeout+c.MaxReadyWait > RuntimeWriteBudget {
		p.bad("SANDBOX_MAX_READY_WAIT", "%s plus REQUEST_TIMEOUT %s exceeds %s: the func runtime drops answers after 30 s", c.MaxReadyWait, c.RequestTimeout, RuntimeWriteBudget)
	}
	if c.MaxConcurrentWaits < 1 {
		p.bad("MAX_CONCURRENT_WAITS", "%d must be at least 1", c.MaxConcurrentWaits)
	}
	if c.MaxRequestBodyBytes < 1024 {
		p.bad("MAX_REQUEST_BODY_BYTES", "%d is below 1024", c.MaxRequestBodyBytes)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		p.bad("LOG_LEVEL", "%q must be debug, info, warn or error", c.LogLevel)
	}
	return p.err()
}

// IsLoopback reports whether a listen address binds only to loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

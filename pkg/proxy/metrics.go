package proxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The reasons a request is counted under (the reason label). The set is
// fixed so the series stay few; the log line carries the detail.
const (
	ReasonOK               = "ok"                // allowed: connected upstream
	ReasonUnknownCaller    = "unknown_caller"    // the source address is no sandbox's
	ReasonBadRequest       = "bad_request"       // not a proxy request we understand, or nothing sent in time
	ReasonIPLiteral        = "ip_literal"        // the target is an address, not a name
	ReasonPort             = "port"              // the port is not an allowed one
	ReasonNotListed        = "not_listed"        // the name is not on the sandbox's list (or the sandbox is not in allowlist mode)
	ReasonForbiddenAddress = "forbidden_address" // the name resolves to a private or cluster address (egress.Judge)
	ReasonSNI              = "sni"               // the TLS server name is not the CONNECT host
	ReasonECH              = "ech"               // the ClientHello hides its server name (Encrypted ClientHello)
	ReasonHostMismatch     = "host_mismatch"     // the HTTP Host is not the target
	ReasonResolve          = "resolve"           // the name did not resolve (502)
	ReasonUpstream         = "upstream"          // no judged address answered (502)
	ReasonTooMany          = "too_many"          // the principal's sandboxes have MaxPerPrincipal connections open (429)
)

var reasons = []string{
	ReasonUnknownCaller, ReasonBadRequest, ReasonIPLiteral, ReasonPort, ReasonNotListed,
	ReasonForbiddenAddress, ReasonSNI, ReasonECH, ReasonHostMismatch, ReasonResolve, ReasonUpstream,
}

// Metrics are the proxy's series.
type Metrics struct {
	requests *prometheus.CounterVec
	connect  prometheus.Histogram
	open     prometheus.Gauge
}

// NewMetrics registers the proxy's series on reg:
//
//   - sandbox_egress_proxy_requests_total{verdict="allowed|refused",reason}
//   - sandbox_egress_proxy_upstream_connect_seconds (histogram)
//   - sandbox_egress_proxy_open_connections (gauge: client connections held)
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandbox_egress_proxy", Name: "requests_total",
			Help: "Proxy requests (a CONNECT or a plain HTTP request), by verdict (allowed or refused) and reason (ok when allowed).",
		}, []string{"verdict", "reason"}),
		connect: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "sandbox_egress_proxy", Name: "upstream_connect_seconds",
			Help:    "Time to open the TCP connection to an allowed upstream (its judged addresses, in turn), successful or not.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "sandbox_egress_proxy", Name: "open_connections",
			Help: "Client connections the proxy holds open (tunnels included).",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.connect, m.open} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the egress proxy's metrics: %w", err)
		}
	}
	// Every series exists from the start, at zero, so a rate over a
	// refusal that has not happened yet is 0 rather than absent.
	m.requests.WithLabelValues("allowed", ReasonOK)
	for _, r := range reasons {
		m.requests.WithLabelValues("refused", r)
	}
	return m, nil
}

func (m *Metrics) count(allowed bool, reason string) {
	if m == nil {
		return
	}
	v := "refused"
	if allowed {
		v = "allowed"
	}
	m.requests.WithLabelValues(v, reason).Inc()
}

func (m *Metrics) observeConnect(seconds float64) {
	if m != nil {
		m.connect.Observe(seconds)
	}
}

func (m *Metrics) openConns(delta float64) {
	if m != nil {
		m.open.Add(delta)
	}
}

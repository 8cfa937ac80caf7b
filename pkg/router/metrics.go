package router

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The port_kind label: which door a request asked for.
const (
	KindEnvd    = "envd"    // EnvdPort, the agent
	KindTraffic = "traffic" // any other port
	KindNone    = "none"    // refused before a port was read
)

// Metrics are the router's series.
type Metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inFlight prometheus.Gauge
	wakes    *prometheus.HistogramVec
}

// NewMetrics registers the router's series on reg:
//
//   - sandbox_router_requests_total{code,port_kind}
//   - sandbox_router_response_header_seconds{port_kind} (histogram: from a
//     request's arrival to its response's header, the router's own answers
//     included; a stream then lasts as long as the sandbox sends)
//   - sandbox_router_in_flight_requests (gauge; streams included)
//   - sandbox_router_wake_seconds{outcome} (histogram: how long a request
//     was held for a paused sandbox it woke; outcome resumed, failed,
//     timeout or gone)
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sandbox_router", Name: "requests_total",
			Help: "Requests, by the status code answered (the router's own or the sandbox's) and the port kind (envd, traffic, or none when refused before the port was read).",
		}, []string{"code", "port_kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "sandbox_router", Name: "response_header_seconds",
			Help:    "Time from a request's arrival to its response's header (the router's own answers included).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"port_kind"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "sandbox_router", Name: "in_flight_requests",
			Help: "Requests being served, open streams included.",
		}),
		wakes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "sandbox_router", Name: "wake_seconds",
			Help:    "How long a request was held for a paused sandbox that resumes on traffic, by outcome (resumed, failed, timeout, gone).",
			Buckets: []float64{.1, .25, .5, 1, 1.5, 2, 3, 5, 10, 30, 60},
		}, []string{"outcome"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.inFlight, m.wakes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the router's metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) observe(code, kind string, seconds float64) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(code, kind).Inc()
	m.latency.WithLabelValues(kind).Observe(seconds)
}

func (m *Metrics) flight(delta float64) {
	if m != nil {
		m.inFlight.Add(delta)
	}
}

func (m *Metrics) woke(outcome string, seconds float64) {
	if m != nil {
		m.wakes.WithLabelValues(outcome).Observe(seconds)
	}
}

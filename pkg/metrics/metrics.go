// Package metrics defines the provisioner's Prometheus series on a registry
// of its own, so tests (and several instances in one process) do not collide.
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "sandbox_provisioner"

// Metrics holds every series the provisioner exports.
type Metrics struct {
	Registry        *prometheus.Registry
	requests        *prometheus.CounterVec
	requestDuration *prometheus.HistogramVec
	createToReady   prometheus.Histogram
	kubeRequests    *prometheus.CounterVec
	kubeDuration    *prometheus.HistogramVec
	reaped          *prometheus.CounterVec
	quotaRefusals   *prometheus.CounterVec
	eventsDropped   prometheus.Counter
	poolClaims      *prometheus.CounterVec
	isolation       *prometheus.GaugeVec
	egressChanges   *prometheus.CounterVec
}

// New registers the series on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "requests_total",
			Help: "Requests handled, by operation, transport (http or cloudevent) and status code.",
		}, []string{"operation", "transport", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "request_duration_seconds",
			Help:    "Time to answer a request, by operation and transport.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"operation", "transport"}),
		createToReady: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "create_to_ready_seconds",
			Help:    "Time from a sandbox Pod's creation to its Ready condition, observed when a caller waits for it.",
			Buckets: []float64{.5, 1, 2, 5, 10, 20, 30, 60, 120},
		}),
		kubeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "kube_requests_total",
			Help: "Kubernetes API calls, by verb, resource and status code (error when no answer came).",
		}, []string{"verb", "resource", "code"}),
		kubeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "kube_request_duration_seconds",
			Help:    "Kubernetes API call latency, by verb and resource.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"verb", "resource"}),
		reaped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "sandboxes_reaped_total",
			Help: "Sandboxes removed by reaping, by reason (idle, lifetime, ended, orphaned-service).",
		}, []string{"reason"}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "quota_refusals_total",
			Help: "Creates refused by a quota, by scope (total or user).",
		}, []string{"scope"}),
		eventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "kubernetes_events_dropped_total",
			Help: "Kubernetes Events not written because they exceeded K8S_EVENTS_QPS/K8S_EVENTS_BURST.",
		}),
		isolation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "isolation_in_force",
			Help: "Whether each isolation check (network_policy, runtime_class) passed when last made in this replica (1) or failed (0): while one is 0, creates are refused.",
		}, []string{"check"}),
		egressChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "egress_changes_total",
			Help: "Egress grants and revokes on allowlist sandboxes, by operation (egress-grant, egress-revoke) and outcome.",
		}, []string{"operation", "outcome"}),
		poolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "pool_claims_total",
			Help: "Creates of templates with a warm pool, by template and result: wired (claimed a wired pooled sandbox, whose URL answered at once), hit (claimed one not wired yet), miss (the request needs what a pooled one lacks), empty (none Ready), error (the pool could not be read or written); all but wired and hit start cold.",
		}, []string{"template", "result"}),
	}
	m.Registry.MustRegister(m.requests, m.requestDuration, m.createToReady, m.kubeRequests, m.kubeDuration,
		m.reaped, m.quotaRefusals, m.eventsDropped, m.poolClaims, m.isolation, m.egressChanges, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// ObserveRequest records one answered request.
func (m *Metrics) ObserveRequest(operation, transport string, code int, d time.Duration) {
	m.requests.WithLabelValues(operation, transport, strconv.Itoa(code)).Inc()
	m.requestDuration.WithLabelValues(operation, transport).Observe(d.Seconds())
}

// CreateToReady implements sandbox.Observer.
func (m *Metrics) CreateToReady(d time.Duration) { m.createToReady.Observe(d.Seconds()) }

// Reaped implements sandbox.Observer.
func (m *Metrics) Reaped(reason string) { m.reaped.WithLabelValues(reason).Inc() }

// QuotaRefused implements sandbox.Observer.
func (m *Metrics) QuotaRefused(scope string) { m.quotaRefusals.WithLabelValues(scope).Inc() }

// PoolClaim counts one create of a pooled template (pool.Observer).
func (m *Metrics) PoolClaim(template, result string) {
	m.poolClaims.WithLabelValues(template, result).Inc()
}

// EventDropped counts one Event over the budget.
func (m *Metrics) EventDropped() { m.eventsDropped.Inc() }

// EgressChanged counts one egress grant or revoke and its outcome.
func (m *Metrics) EgressChanged(op, outcome string) {
	m.egressChanges.WithLabelValues(op, outcome).Inc()
}

// Isolation records whether an isolation check is in force.
func (m *Metrics) Isolation(check string, inForce bool) {
	v := 0.0
	if inForce {
		v = 1
	}
	m.isolation.WithLabelValues(check).Set(v)
}

// WrapTransport instruments every Kubernetes API call made through rt.
func (m *Metrics) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{next: rt, m: m}
}

type roundTripper struct {
	next http.RoundTripper
	m    *Metrics
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	verb, resource := describe(req)
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	code := "error"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	t.m.kubeRequests.WithLabelValues(verb, resource, code).Inc()
	if verb != "watch" { // a watch's duration is how long it stayed open, not latency
		t.m.kubeDuration.WithLabelValues(verb, resource).Observe(time.Since(start).Seconds())
	}
	return resp, err
}

// describe maps a REST request to a Kubernetes verb and resource, e.g.
// GET /api/v1/namespaces/x/pods -> list pods.
func describe(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	// Skip the group/version prefix: api/v1 or apis/<group>/<version>.
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return strings.ToLower(req.Method), "other"
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	named := len(parts) >= 2
	if len(parts) > 0 {
		resource = parts[0]
	}
	if len(parts) >= 3 {
		resource += "/" + parts[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}

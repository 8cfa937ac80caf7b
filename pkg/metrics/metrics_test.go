package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDescribe: every Kubernetes API call is counted under the verb and
// resource an operator reads in the API server's own terms, whatever the
// group, version, namespace or name in its path.
func TestDescribe(t *testing.T) {
	tests := []struct {
		method, url    string
		verb, resource string
	}{
		{"GET", "/api/v1/namespaces/ns/pods", "list", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods/sandbox-a", "get", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=1", "watch", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods/sandbox-a/log", "get", "pods/log"},
		{"POST", "/apis/apps/v1/namespaces/ns/replicasets", "create", "replicasets"},
		{"PUT", "/api/v1/namespaces/ns/services/sandbox-a-svc", "update", "services"},
		{"PATCH", "/apis/apps/v1/namespaces/ns/replicasets/sandbox-a", "patch", "replicasets"},
		{"DELETE", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "delete", "leases"},
		{"GET", "/api/v1/namespaces", "list", "namespaces"},
		{"GET", "/api/v1/namespaces/ns", "get", "namespaces"},
		{"POST", "/apis/authentication.k8s.io/v1/tokenreviews", "create", "tokenreviews"},
		{"GET", "/version", "get", "other"},
		{"OPTIONS", "/api/v1/namespaces/ns/pods", "options", "pods"},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.url, func(t *testing.T) {
			verb, resource := describe(httptest.NewRequest(tc.method, tc.url, nil))
			if diff := cmp.Diff([]string{tc.verb, tc.resource}, []string{verb, resource}); diff != "" {
				t.Errorf("describe (-want +got):\n%s", diff)
			}
		})
	}
}

// roundTrip answers with code, or fails without an answer when code is 0.
type roundTrip int

func (code roundTrip) RoundTrip(*http.Request) (*http.Response, error) {
	if code == 0 {
		return nil, errors.New("connection refused")
	}
	return &http.Response{StatusCode: int(code), Body: http.NoBody}, nil
}

// series is every sample of the registry's own series (not the Go and
// process collectors'), as "name{label=value,...} value", sorted; a
// histogram shows its count.
func series(t *testing.T, m *Metrics) []string {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), namespace+"_") {
			continue
		}
		for _, s := range f.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			var v float64
			switch {
			case s.Counter != nil:
				v = s.GetCounter().GetValue()
			case s.Gauge != nil:
				v = s.GetGauge().GetValue()
			case s.Histogram != nil:
				v = float64(s.GetHistogram().GetSampleCount())
			}
			out = append(out, f.GetName()+"{"+strings.Join(labels, ",")+"} "+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	sort.Strings(out)
	return out
}

// TestSeries: what the Manager, the pool and the doors report lands in
// the series an operator reads, under the labels it names; a Kubernetes
// call is counted by its answer's code, or "error" when none came, and a
// watch's time open is no latency.
func TestSeries(t *testing.T) {
	m := New()
	m.ObserveRequest("create", "http", 201, 30*time.Millisecond)
	m.ObserveRequest("create", "cloudevent", 429, time.Millisecond)
	m.CreateToReady(2 * time.Second)
	m.Reaped("idle")
	m.Reaped("idle")
	m.Reaped("paused")
	m.QuotaRefused("user")
	m.PoolClaim("python", "wired")
	m.EventDropped()
	m.EgressChanged("egress-grant", "ok")
	m.Isolation("network_policy", true)
	m.Isolation("runtime_class", true)
	m.Isolation("runtime_class", false)
	for _, c := range []struct {
		code roundTrip
		url  string
	}{{200, "/api/v1/namespaces/ns/pods"}, {404, "/api/v1/namespaces/ns/pods/p"}, {0, "/api/v1/namespaces/ns/services"}, {200, "/api/v1/namespaces/ns/pods?watch=true"}} {
		resp, err := m.WrapTransport(c.code).RoundTrip(httptest.NewRequest("GET", c.url, nil))
		if (err != nil) != (c.code == 0) {
			t.Fatalf("RoundTrip(%s) = %v, %v", c.url, resp, err)
		}
	}
	want := []string{
		"sandbox_provisioner_create_to_ready_seconds{} 1",
		"sandbox_provisioner_egress_changes_total{operation=egress-grant,outcome=ok} 1",
		"sandbox_provisioner_isolation_in_force{check=network_policy} 1",
		"sandbox_provisioner_isolation_in_force{check=runtime_class} 0",
		"sandbox_provisioner_kube_request_duration_seconds{resource=pods,verb=get} 1",
		"sandbox_provisioner_kube_request_duration_seconds{resource=pods,verb=list} 1",
		"sandbox_provisioner_kube_request_duration_seconds{resource=services,verb=list} 1",
		"sandbox_provisioner_kube_requests_total{code=200,resource=pods,verb=list} 1",
		"sandbox_provisioner_kube_requests_total{code=200,resource=pods,verb=watch} 1",
		"sandbox_provisioner_kube_requests_total{code=404,resource=pods,verb=get} 1",
		"sandbox_provisioner_kube_requests_total{code=error,resource=services,verb=list} 1",
		"sandbox_provisioner_kubernetes_events_dropped_total{} 1",
		"sandbox_provisioner_pool_claims_total{result=wired,template=python} 1",
		"sandbox_provisioner_quota_refusals_total{scope=user} 1",
		"sandbox_provisioner_request_duration_seconds{operation=create,transport=cloudevent} 1",
		"sandbox_provisioner_request_duration_seconds{operation=create,transport=http} 1",
		"sandbox_provisioner_requests_total{code=201,operation=create,transport=http} 1",
		"sandbox_provisioner_requests_total{code=429,operation=create,transport=cloudevent} 1",
		"sandbox_provisioner_sandboxes_reaped_total{reason=idle} 2",
		"sandbox_provisioner_sandboxes_reaped_total{reason=paused} 1",
	}
	if diff := cmp.Diff(want, series(t, m)); diff != "" {
		t.Errorf("series (-want +got):\n%s", diff)
	}
}

// TestHandlerServesTheRegistry: /metrics answers the registry's series in
// the Prometheus text format, the Go runtime's beside ours.
func TestHandlerServesTheRegistry(t *testing.T) {
	m := New()
	m.Reaped("ended")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, line := range []string{`sandbox_provisioner_sandboxes_reaped_total{reason="ended"} 1`, "# TYPE go_goroutines gauge"} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", line, body)
		}
	}
}

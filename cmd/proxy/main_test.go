package main

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

const ns = "sandboxes"

func pod(name, ip string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc", keys.LabelToken: "tok",
			keys.LabelEgress: "allowlist",
		}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
	if mod != nil {
		mod(p)
	}
	return p
}

func service(mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-abc-svc", Namespace: ns,
			Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc"},
			Annotations: map[string]string{
				keys.AnnotationEgressAllow:  "example.com, *.example.org",
				keys.AnnotationEgressGrants: `[{"name":"granted.example.net","until":"2030-01-01T00:00:00Z"}]`,
			}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{keys.LabelID: "abc", keys.LabelToken: "tok"}},
	}
	if mod != nil {
		mod(s)
	}
	return s
}

func TestLookup(t *testing.T) {
	until := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	wantPolicy := egress.Policy{Mode: egress.Allowlist, Allow: []string{"*.example.org", "example.com"},
		Grants: []egress.Grant{{Name: "granted.example.net", Until: &until}}}
	src := netip.MustParseAddr("10.244.0.7")
	rows := []struct {
		name    string
		pods    []*corev1.Pod
		svc     *corev1.Service
		wantID  string
		want    egress.Policy
		wantErr string
	}{{
		name: "the sandbox's Pod", pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil)}, svc: service(nil),
		wantID: "abc", want: wantPolicy,
	}, {
		name: "a dual-stack Pod by its second address",
		pods: []*corev1.Pod{pod("sandbox-abc", "fd00::7", func(p *corev1.Pod) {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: "10.244.0.7"})
		})},
		svc: service(nil), wantID: "abc", want: wantPolicy,
	}, {
		name: "no Pod", pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.8", nil)}, svc: service(nil),
		wantErr: "no running sandbox Pod has this address",
	}, {
		name: "a Pod not running",
		pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })},
		svc:  service(nil), wantErr: "no running sandbox Pod has this address",
	}, {
		name: "a terminating Pod",
		pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: until} })},
		svc:  service(nil), wantErr: "no running sandbox Pod has this address",
	}, {
		name:    "two running Pods with the address",
		pods:    []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil), pod("sandbox-abd", "10.244.0.7", nil)},
		svc:     service(nil),
		wantErr: "2 running sandbox Pods claim this address",
	}, {
		name: "a host-network Pod",
		pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", func(p *corev1.Pod) { p.Spec.HostNetwork = true })},
		svc:  service(nil), wantErr: "uses the host network",
	}, {
		name: "an unclaimed pooled Pod",
		pods: []*corev1.Pod{pod("pool-x", "10.244.0.7", func(p *corev1.Pod) { delete(p.Labels, keys.LabelID) })},
		svc:  service(nil), wantErr: "unclaimed pooled Pod and belongs to no sandbox",
	}, {
		name: "a bad mode",
		pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", func(p *corev1.Pod) { p.Labels[keys.LabelEgress] = "wide" })},
		svc:  service(nil), wantErr: `egress mode "wide"`,
	}, {
		name: "an open-mode Pod: its policy, for the proxy to refuse",
		pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", func(p *corev1.Pod) { delete(p.Labels, keys.LabelEgress) })},
		svc:  service(nil), wantID: "abc",
		want: egress.Policy{Mode: egress.Open, Allow: wantPolicy.Allow, Grants: wantPolicy.Grants},
	}, {
		name: "no Service", pods: []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil)},
		wantErr: "sandbox abc has no Service sandbox-abc-svc",
	}, {
		name:    "a Service of another id",
		pods:    []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil)},
		svc:     service(func(s *corev1.Service) { s.Labels[keys.LabelID] = "abd" }),
		wantErr: "is not the Pod sandbox abc's Service selects",
	}, {
		name:    "a Service selecting another token",
		pods:    []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil)},
		svc:     service(func(s *corev1.Service) { s.Spec.Selector[keys.LabelToken] = "other" }),
		wantErr: "is not the Pod sandbox abc's Service selects",
	}, {
		name:    "a Pod and Service without tokens",
		pods:    []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", func(p *corev1.Pod) { delete(p.Labels, keys.LabelToken) })},
		svc:     service(func(s *corev1.Service) { delete(s.Spec.Selector, keys.LabelToken) }),
		wantErr: "is not the Pod sandbox abc's Service selects",
	}, {
		name:    "a bad list",
		pods:    []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil)},
		svc:     service(func(s *corev1.Service) { s.Annotations[keys.AnnotationEgressAllow] = "10.0.0.1" }),
		wantErr: "egress-allow annotation",
	}, {
		name:    "bad grants",
		pods:    []*corev1.Pod{pod("sandbox-abc", "10.244.0.7", nil)},
		svc:     service(func(s *corev1.Service) { s.Annotations[keys.AnnotationEgressGrants] = "{" }),
		wantErr: "egress-grants annotation",
	}}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{podIPIndex: indexPodIPs})
			for _, p := range r.pods {
				if err := pods.Add(p); err != nil {
					t.Fatal(err)
				}
			}
			svcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if r.svc != nil {
				if err := svcs.Add(r.svc); err != nil {
					t.Fatal(err)
				}
			}
			look := lookup(pods, listerscorev1.NewServiceLister(svcs).Services(ns), slog.New(slog.DiscardHandler))
			id, pol, err := look(context.Background(), src)
			if r.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), r.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, r.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id != r.wantID {
				t.Errorf("id %q, want %q", id, r.wantID)
			}
			if diff := cmp.Diff(r.want, pol); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadSettings(t *testing.T) {
	rows := []struct {
		name    string
		env     map[string]string
		want    settings
		wantErr string
	}{{
		name: "defaults",
		env:  map[string]string{"POD_NAMESPACE": "ns"},
		want: settings{addr: ":3128", metricsAddr: ":9090", namespace: "ns", ports: []uint16{80, 443}},
	}, {
		name: "everything set",
		env: map[string]string{"POD_NAMESPACE": "ns", "PROXY_ADDR": ":8080", "PROXY_METRICS_ADDR": "127.0.0.1:9999",
			"PROXY_RESOLVER": "10.96.0.10:53", "PROXY_DENY_CIDRS": "203.0.113.7/24, 2001:db8::/32", "PROXY_PORTS": "443"},
		want: settings{addr: ":8080", metricsAddr: "127.0.0.1:9999", namespace: "ns", resolver: "10.96.0.10:53",
			deny:  []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32")},
			ports: []uint16{443}},
	}, {
		name: "no namespace", env: map[string]string{}, wantErr: "POD_NAMESPACE is required",
	}, {
		name: "a resolver without a port", env: map[string]string{"POD_NAMESPACE": "ns", "PROXY_RESOLVER": "10.96.0.10"},
		wantErr: "PROXY_RESOLVER",
	}, {
		name: "a bad range", env: map[string]string{"POD_NAMESPACE": "ns", "PROXY_DENY_CIDRS": "10.0.0.0"},
		wantErr: "PROXY_DENY_CIDRS",
	}, {
		name: "a bad port", env: map[string]string{"POD_NAMESPACE": "ns", "PROXY_PORTS": "80,70000"},
		wantErr: `PROXY_PORTS: "70000"`,
	}, {
		name: "port zero", env: map[string]string{"POD_NAMESPACE": "ns", "PROXY_PORTS": "0"},
		wantErr: `PROXY_PORTS: "0"`,
	}}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			got, err := loadSettings(func(k string) string { return r.env[k] })
			if r.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), r.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, r.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(r.want, got, cmp.AllowUnexported(settings{}), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("settings (-want +got):\n%s", diff)
			}
		})
	}
}

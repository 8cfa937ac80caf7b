package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/router"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

func TestLoadSettings(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	short := filepath.Join(dir, "short")
	os.WriteFile(good, []byte(strings.Repeat("k", 32)+"\n"), 0o600)
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	rows := []struct {
		name    string
		env     map[string]string
		want    settings
		wantErr string
	}{
		{"defaults", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good},
			settings{addr: ":8080", metricsAddr: ":9090", namespace: "sb", fairness: router.DefaultFairness}, ""},
		{"addresses", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "ROUTER_ADDR": ":80", "ROUTER_METRICS_ADDR": "127.0.0.1:9"},
			settings{addr: ":80", metricsAddr: "127.0.0.1:9", namespace: "sb", fairness: router.DefaultFairness}, ""},
		{"an E2B domain", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "E2B_DOMAIN": " sandboxes.example.com "},
			settings{addr: ":8080", metricsAddr: ":9090", namespace: "sb", domain: "sandboxes.example.com", fairness: router.DefaultFairness}, ""},
		{"fair shares", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "PRINCIPAL_REQUESTS_PER_SECOND": "50.5", "PRINCIPAL_REQUEST_BURST": "20", "PRINCIPAL_MAX_CONCURRENT_REQUESTS": " 8 "},
			settings{addr: ":8080", metricsAddr: ":9090", namespace: "sb", fairness: fairness.Limits{RequestsPerSecond: 50.5, Burst: 20, MaxInProgress: 8}}, ""},
		{"a rate that is no number", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "PRINCIPAL_REQUESTS_PER_SECOND": "fast"}, settings{}, "PRINCIPAL_REQUESTS_PER_SECOND"},
		{"a burst that is no whole number", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "PRINCIPAL_REQUEST_BURST": "1.5"}, settings{}, "PRINCIPAL_REQUEST_BURST"},
		{"no open request admitted", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "PRINCIPAL_MAX_CONCURRENT_REQUESTS": "0"}, settings{}, "PRINCIPAL_MAX_CONCURRENT_REQUESTS"},
		{"an E2B domain of one label", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "E2B_DOMAIN": "localhost"}, settings{}, "E2B_DOMAIN"},
		{"an E2B domain that is no DNS name", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": good, "E2B_DOMAIN": "https://e2b.example.com"}, settings{}, "E2B_DOMAIN"},
		{"no namespace", map[string]string{"E2B_TOKEN_KEY_FILE": good}, settings{}, "POD_NAMESPACE is required"},
		{"no key", map[string]string{"POD_NAMESPACE": "sb"}, settings{}, "E2B_TOKEN_KEY_FILE is required"},
		{"a missing key file", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": filepath.Join(dir, "nope")}, settings{}, "reading the token key"},
		{"a short key", map[string]string{"POD_NAMESPACE": "sb", "E2B_TOKEN_KEY_FILE": short}, settings{}, "it needs at least 32"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			got, err := loadSettings(func(k string) string { return r.env[k] })
			if r.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), r.wantErr) {
					t.Fatalf("loadSettings = %v; want an error containing %q", err, r.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got.key) != 32 {
				t.Errorf("key of %d bytes; want the file's 32 (trimmed)", len(got.key))
			}
			got.key = nil
			if d := cmp.Diff(r.want, got, cmp.AllowUnexported(settings{})); d != "" {
				t.Errorf("settings (-want +got):\n%s", d)
			}
		})
	}
}

// TestCaches runs the informers over a fake clientset: a sandbox claimed
// from a wired pool resolves (its wire is in the wires' cache), and what
// carries neither label set is not cached.
func TestCaches(t *testing.T) {
	const ns, name = "sb", "sandbox-pool-py-x7k2p"
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: "uid-1"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: "uid-1",
			Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc", keys.LabelToken: "tok",
				keys.LabelPod: name, keys.LabelPooled: "true", router.LabelEnvd: "true"},
			Annotations: map[string]string{keys.AnnotationPrincipal: "alice", keys.AnnotationCreatedAt: "2026-11-28T11:00:00Z"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.7"},
	}
	wire := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: owner,
			Labels: map[string]string{keys.LabelComponent: keys.ComponentWireValue, keys.LabelManagedBy: keys.ManagedByValue}},
		Spec: corev1.ServiceSpec{Selector: resources.WireSelector(name, "tok")},
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: resources.ServiceName("abc"), Namespace: ns, OwnerReferences: owner,
		Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc"}}}
	resources.Reference(svc, wire)
	other := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-provisioner", Namespace: ns}}
	otherPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: ns, Labels: map[string]string{keys.LabelID: "abc"}}}
	elsewhere := pod.DeepCopy()
	elsewhere.Namespace = "other"

	c, err := newCaches(fake.NewClientset(pod, wire, svc, other, otherPod, elsewhere), ns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.start(ctx.Done())
	if !c.sync(ctx.Done()) {
		t.Fatal("caches did not sync")
	}
	got, err := c.resolver.Resolve("abc")
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod != name || got.IP != "10.244.0.7" || !got.Envd || got.Sandbox.Principal != "alice" {
		t.Errorf("Resolve = %+v; want the claimed Pod", got)
	}
	if _, err := c.resolver.Services.Get("sandbox-provisioner"); err == nil {
		t.Error("an unlabelled Service is cached; want only sandbox Services")
	}
	if _, err := c.resolver.Wires.Get(resources.ServiceName("abc")); err == nil {
		t.Error("the sandbox Service is in the wires' cache")
	}
	if objs, _ := c.resolver.Pods.ByIndex(router.IDIndex, "abc"); len(objs) != 1 {
		t.Errorf("%d Pods cached under id abc; want the sandbox's alone (not another namespace's, not an unlabelled one)", len(objs))
	}
}

// TestServerSpeaksH2C: the router's server takes HTTP/2 without TLS from a
// client that knows it (prior knowledge), and HTTP/1.1.
func TestServerSpeaksH2C(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(r.Proto)) }))
	go srv.Serve(ln)
	defer srv.Close()
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	for _, c := range []struct {
		client *http.Client
		want   string
	}{
		{&http.Client{Transport: &http.Transport{Protocols: &h2, TLSClientConfig: &tls.Config{}}}, "HTTP/2.0"},
		{http.DefaultClient, "HTTP/1.1"},
	} {
		resp, err := c.client.Get("http://" + ln.Addr().String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 16)
		n, rerr := resp.Body.Read(b)
		resp.Body.Close()
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			t.Fatal(rerr)
		}
		if string(b[:n]) != c.want {
			t.Errorf("served over %q; want %s", b[:n], c.want)
		}
	}
}

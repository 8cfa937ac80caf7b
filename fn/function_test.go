package fn

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	fhttp "knative.dev/func-go/http"
)

func TestBeforeStart(t *testing.T) {
	f := New()
	if ok, _ := f.Ready(context.Background()); ok {
		t.Error("ready before Start")
	}
	for path, want := range map[string]int{"/health": http.StatusOK, "/api/sandboxes": http.StatusServiceUnavailable} {
		w := httptest.NewRecorder()
		f.Handle(w, httptest.NewRequest("GET", path, nil))
		if w.Code != want {
			t.Errorf("GET %s before Start: %d, want %d", path, w.Code, want)
		}
	}
}

func TestStartRejectsBadConfigNamingTheVariable(t *testing.T) {
	t.Setenv("SANDBOX_SERVICE_TYPE", "LoadBalancer")
	err := New().Start(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "SANDBOX_SERVICE_TYPE") {
		t.Fatalf("Start error = %v, want one naming SANDBOX_SERVICE_TYPE", err)
	}
}

// TestStartNeverBlocks: without any kubeconfig, Start returns at once,
// /health answers, and readiness says why it is not ready.
func TestStartNeverBlocks(t *testing.T) {
	t.Setenv("KUBECONFIG", "/nonexistent/kubeconfig")
	t.Setenv("KUBECONFIG_PATH", "/nonexistent/kubeconfig")
	t.Setenv("PROVISIONER_API_KEY", "0123456789abcdef-key")
	f := New()
	if err := f.Start(context.Background(), map[string]string{"LOG_LEVEL": "error"}); err != nil {
		t.Fatal(err)
	}
	defer f.Stop(context.Background())
	w := httptest.NewRecorder()
	f.Handle(w, httptest.NewRequest("GET", "/health", nil))
	if w.Code != http.StatusOK {
		t.Errorf("/health: %d", w.Code)
	}
	// Through the runtime that ships: not ready is 503 (an error would be 500).
	w = httptest.NewRecorder()
	fhttp.New(f).Ready(w, httptest.NewRequest("GET", "/health/readiness", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("/health/readiness without a cluster: %d %s, want 503", w.Code, w.Body)
	}
	r := httptest.NewRequest("GET", "/api/sandboxes", nil)
	r.Header.Set("X-API-Key", "0123456789abcdef-key")
	w = httptest.NewRecorder()
	f.Handle(w, r)
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("list without a cluster: %d %s, want 503", w.Code, w.Body)
	}
}

// TestStartRefusesAuthDisabledWhenDeployed: the development switch stops
// start-up under Knative (K_SERVICE, which the func runtime's cfg map may
// also carry) and in a cluster, even on a loopback address.
func TestStartRefusesAuthDisabledWhenDeployed(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		cfg  map[string]string
	}{
		{"K_SERVICE", map[string]string{"K_SERVICE": "sandbox-provisioner"}, nil},
		{"K_SERVICE from the runtime's cfg", nil, map[string]string{"K_SERVICE": "sandbox-provisioner"}},
		{"KUBERNETES_SERVICE_HOST", map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PROVISIONER_AUTH_DISABLED", "true")
			t.Setenv("LISTEN_ADDRESS", "127.0.0.1:8080")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if tc.cfg != nil {
				t.Setenv("K_SERVICE", "") // set, so t.Setenv restores it; then unset for cfg to fill
				os.Unsetenv("K_SERVICE")
			}
			err := New().Start(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), "PROVISIONER_AUTH_DISABLED") {
				t.Fatalf("Start error = %v, want one naming PROVISIONER_AUTH_DISABLED", err)
			}
		})
	}
}

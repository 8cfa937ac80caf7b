package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
)

// unavailable is a domain that is always down, to check the status mapping.
type unavailable struct{}

func (unavailable) Create(context.Context, sandbox.Spec, time.Duration) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, &sandbox.Error{Kind: sandbox.KindUnavailable, Detail: "down"}
}
func (unavailable) Get(context.Context, string, time.Duration) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, &sandbox.Error{Kind: sandbox.KindTimeout, Detail: "slow"}
}
func (unavailable) List(context.Context) ([]sandbox.Sandbox, error) { return nil, nil }
func (unavailable) Destroy(context.Context, string) error           { return nil }
func (unavailable) Reap(context.Context) (sandbox.Reaped, error)    { return sandbox.Reaped{}, nil }

func newAPI(t *testing.T, env map[string]string) *API {
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, unavailable{}, metrics.New())
}

func TestAuthFailsClosed(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		key  string
		want int
	}{
		{"no key configured", nil, "", 401},
		{"no key configured, key sent", nil, "anything", 401},
		{"explicit opt-out", map[string]string{"PROVISIONER_AUTH_DISABLED": "true"}, "", 200},
		{"right key", map[string]string{"PROVISIONER_API_KEY": "k"}, "k", 200},
		{"wrong key", map[string]string{"PROVISIONER_API_KEY": "k"}, "K", 401},
		{"prefix of the key", map[string]string{"PROVISIONER_API_KEY": "key"}, "ke", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPI(t, tc.env)
			r := httptest.NewRequest("GET", "/api/sandboxes", nil)
			if tc.key != "" {
				r.Header.Set("X-API-Key", tc.key)
			}
			w := httptest.NewRecorder()
			a.ServeHTTP(w, r)
			if w.Code != tc.want || (w.Code != 200 && !strings.Contains(w.Body.String(), "detail")) {
				t.Errorf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
		})
	}
}

func TestTransientErrorsAreNever404(t *testing.T) {
	a := newAPI(t, map[string]string{"PROVISIONER_API_KEY": "k"})
	for path, want := range map[string]int{"/api/sandboxes/abc": http.StatusGatewayTimeout} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-API-Key", "k")
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		if w.Code != want || strings.Contains(w.Body.String(), "NotFound") {
			t.Errorf("GET %s: %d %s, want %d", path, w.Code, w.Body, want)
		}
	}
	r := httptest.NewRequest("POST", "/api/sandboxes", strings.NewReader(`{"sandbox_id":"abc"}`))
	r.Header.Set("X-API-Key", "k")
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("create while unavailable: %d %v", w.Code, w.Header())
	}
}

func TestParseWait(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false}, {"30", 30 * time.Second, false}, {"1.5", 1500 * time.Millisecond, false},
		{"45s", 45 * time.Second, false}, {"2m", 2 * time.Minute, false},
		{"3m", 0, true}, {"-1", 0, true}, {"soon", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseWait(tc.in, 2*time.Minute)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseWait(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

package monitor

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestServesMetricsHealthAndReadiness(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "monitor_test_total", Help: "a test counter"})
	reg.MustRegister(c)
	c.Inc()
	var ready atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	s := Start(ctx, addr, reg, ready.Load, "caches not synced", slog.New(slog.NewTextHandler(io.Discard, nil)), func() {})
	defer s.Shutdown(context.Background())
	get := func(path string) string {
		t.Helper()
		for range 50 { // the listener starts in the background
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.Status[:3] + " " + strings.TrimSpace(string(b))
		}
		t.Fatalf("%s never answered", path)
		return ""
	}
	got := map[string]string{"healthz": get("/healthz"), "readyz before": get("/readyz")}
	ready.Store(true)
	got["readyz after"] = get("/readyz")
	cancel()
	got["readyz stopping"] = get("/readyz")
	want := map[string]string{"healthz": "200 ok", "readyz before": "503 not ready: caches not synced", "readyz after": "200 ok",
		"readyz stopping": "503 not ready: caches not synced"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if m := get("/metrics"); !strings.Contains(m, "monitor_test_total 1") {
		t.Errorf("/metrics does not carry the registry's counter:\n%s", m)
	}
}

// Package monitor serves what watches an always-on component (the egress
// proxy, the E2B router): its Prometheus metrics, and liveness and
// readiness for the kubelet, on a port of their own, apart from the traffic
// the component serves.
package monitor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves /metrics from reg, /healthz (always ok: the process runs)
// and /readyz (ok once ready says so and ctx is live; otherwise 503 with
// notReady, the reason a person reads).
type Server struct {
	srv *http.Server
}

// Start listens on addr in the background; a listener that fails logs and
// calls stop, so the component exits rather than run unwatched.
func Start(ctx context.Context, addr string, reg *prometheus.Registry, ready func() bool, notReady string, log *slog.Logger, stop func()) *Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() || ctx.Err() != nil {
			http.Error(w, "not ready: "+notReady, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	s := &Server{srv: &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := s.srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "addr", addr, "error", err.Error())
			stop()
		}
	}()
	return s
}

// Shutdown stops the server within ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

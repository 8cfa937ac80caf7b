// Package server runs a function instance the way the Knative func Go
// runtime does: one listener on LISTEN_ADDRESS, /health/readiness and
// /health/liveness from the instance's hooks, everything else to Handle, and
// a graceful drain on SIGTERM.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// Instance is the function contract: Handle plus the lifecycle hooks.
type Instance interface {
	Handle(http.ResponseWriter, *http.Request)
	Start(ctx context.Context, cfg map[string]string) error
	Stop(ctx context.Context) error
	Ready(ctx context.Context) (bool, error)
	Alive(ctx context.Context) (bool, error)
}

// DefaultAddress is the func runtime's default listen address.
const DefaultAddress = "[::]:8080"

// Run serves f until ctx ends, then drains for up to drain.
func Run(ctx context.Context, f Instance, addr string, drain time.Duration) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	return Serve(ctx, f, ln, drain)
}

// Serve is Run on an existing listener (tests pass 127.0.0.1:0).
func Serve(ctx context.Context, f Instance, ln net.Listener, drain time.Duration) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/health/readiness", probe(f.Ready))
	mux.HandleFunc("/health/liveness", probe(f.Alive))
	mux.HandleFunc("/", f.Handle)
	// The func runtime's timeouts: a body must arrive within 30 s, and an
	// answer be written within 30 s (every wait is capped to fit).
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second}

	// Start runs concurrently with the first requests, as in the func
	// runtime; readiness stays false until it is done.
	startErr := make(chan error, 1)
	go func() { startErr <- f.Start(ctx, environ()) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	slog.Info("listening", "address", ln.Addr().String())

	select {
	case err := <-startErr:
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("start: %w", err)
		}
	case err := <-serveErr:
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return err
	}
	dctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	shutdownErr := srv.Shutdown(dctx)
	stopErr := f.Stop(dctx)
	if errors.Is(shutdownErr, http.ErrServerClosed) {
		shutdownErr = nil
	}
	return errors.Join(shutdownErr, stopErr)
}

func probe(check func(context.Context) (bool, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ok, err := check(r.Context())
		w.Header().Set("Content-Type", "text/plain")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			msg := "not ready"
			if err != nil {
				msg += ": " + err.Error()
			}
			fmt.Fprintln(w, msg)
			return
		}
		fmt.Fprintln(w, "OK")
	}
}

func environ() map[string]string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

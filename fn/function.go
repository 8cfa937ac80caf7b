// Package fn is the function instance the Knative func runtime
// (knative.dev/func-go/http) drives: lifecycle hooks, wiring, and routing
// between the HTTP API and CloudEvents on one handler. Listening, timeouts,
// signals and draining in-flight requests are the runtime's job.
package fn

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/e2b"
	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/httpapi"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/problem"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// Function is the provisioner instance. It holds no sandbox state: only the
// wiring to the API server, so a cold replica answers like a warm one.
type Function struct {
	started atomic.Bool
	log     *slog.Logger
	cfg     *config.Config
	api     http.Handler
	e2b     *e2b.API
	events  *events.Handler
	backend *backend
	stop    context.CancelFunc
}

// New returns an instance; Start configures it.
func New() *Function {
	return &Function{log: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
}

// Start reads the configuration (from the environment, with cfg filling in
// variables the environment lacks) and begins connecting to the API server in
// the background: start-up never blocks on a kubeconfig or an API server.
// A bad configuration fails here, naming the variable.
func (f *Function) Start(ctx context.Context, cfg map[string]string) error {
	for k, v := range cfg {
		if _, set := os.LookupEnv(k); !set {
			_ = os.Setenv(k, v)
		}
	}
	c, err := config.Load()
	if err != nil {
		return err
	}
	f.cfg = c
	if _, set := os.LookupEnv("GOGC"); !set {
		// A scale-to-zero function is packed by memory: let the heap grow
		// by half between collections, not double (a list of a thousand
		// sandboxes is the largest thing it holds, briefly).
		debug.SetGCPercent(50)
	}
	f.log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: parseLevel(c.LogLevel)})).With("component", "sandbox-provisioner")
	slog.SetDefault(f.log)
	m := metrics.New()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.stop = cancel
	// The audit trail is written whatever LOG_LEVEL says.
	audit := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "sandbox-provisioner")
	f.backend = newBackend(c, m, f.log, audit)
	authn := auth.FromConfig(&c.AuthConfig, f.backend)
	// One gate for both doors: a principal's rate and concurrency are its
	// own whichever door it uses.
	gate := fairness.FromConfig(&c.FairnessConfig)
	f.api = httpapi.New(c, authn, f.backend, m, httpapi.WithGate(gate))
	f.events = events.New(c, authn, f.backend, m, events.WithGate(gate))
	f.e2b = e2b.New(c, authn, f.backend, m, gate)
	go f.backend.connect(runCtx)
	switch {
	case c.AuthDisabled:
		f.log.Warn("PROVISIONER_AUTH_DISABLED=true: every request is accepted without credentials as the administrator \"anonymous\" (development only: loopback, not under Knative, not in a cluster)")
	case !authn.KeyUsable():
		f.log.Error("API keys are refused: "+authn.KeyProblem()+"; only bearer tokens can authenticate", "token_audience", c.TokenAudience)
	case authn.KeyProblem() != "":
		f.log.Info("PROVISIONER_API_KEY is not used (" + authn.KeyProblem() + "); the keys of PROVISIONER_API_KEYS authenticate")
	}
	if authn.TokensEnabled() && len(c.AllowedSubjects) == 0 {
		f.log.Warn("AUTH_TOKEN_AUDIENCE is set but AUTH_ALLOWED_SUBJECTS is empty: every verified token gets 403")
	}
	f.log.Info("started", "namespace", c.Namespace, "service_type", c.ServiceType, "image", c.SandboxImage)
	f.started.Store(true)
	return nil
}

// Stop stops background work. The runtime calls it after its HTTP server
// has drained the requests in flight.
func (f *Function) Stop(context.Context) error {
	if f.stop != nil {
		f.stop()
	}
	if f.backend != nil {
		f.backend.shutdown()
	}
	return nil
}

// Ready is true once Start finished and the API server answers. Not being
// ready is not an error: the runtime answers 503 for false and 500 for an
// error, and an API server outage is the former.
func (f *Function) Ready(ctx context.Context) (bool, error) {
	if !f.started.Load() {
		return false, nil
	}
	if err := f.backend.ready(ctx); err != nil {
		f.log.Debug("not ready", "reason", err.Error())
		return false, nil
	}
	return true, nil
}

// Alive is true while the process can serve; the API server's health is
// readiness, not liveness, so an outage does not get us restarted.
func (f *Function) Alive(context.Context) (bool, error) { return true, nil }

// Handle routes one request: api.<E2B_DOMAIN> and /e2b/... to E2B's control
// plane, CloudEvents to the events door, POST / to the invoke door,
// everything else to the DeerFlow-compatible HTTP API.
func (f *Function) Handle(w http.ResponseWriter, r *http.Request) {
	id := reqid.Sanitize(r.Header.Get(reqid.Header))
	w.Header().Set(reqid.Header, id)
	if !f.started.Load() {
		if r.URL.Path == "/health" {
			problem.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
			return
		}
		problem.WriteDetail(w, http.StatusServiceUnavailable, "the provisioner is starting; retry in a moment")
		return
	}
	r = r.WithContext(reqid.With(r.Context(), f.log, id))
	switch {
	case e2b.IsAPIHost(r.Host, f.cfg.Domain):
		// E2B's own host serves E2B's API alone, at its root.
		f.e2b.ServeRoot(w, r)
	case events.IsCloudEvent(r):
		f.events.ServeHTTP(w, r)
	case r.Method == http.MethodPost && (r.URL.Path == "/" || r.URL.Path == ""):
		f.events.Invoke(w, r)
	case r.URL.Path == e2b.Prefix || strings.HasPrefix(r.URL.Path, e2b.Prefix+"/"):
		f.e2b.ServeHTTP(w, r)
	default:
		f.api.ServeHTTP(w, r)
	}
}

func parseLevel(s string) slog.Level {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// readyCacheTTL bounds how often readiness asks the API server.
const readyCacheTTL = time.Second

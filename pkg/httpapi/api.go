// Package httpapi is the HTTP front door, wire-compatible with DeerFlow's
// sandbox provisioner: decode, authenticate, validate, call the domain, answer.
package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/problem"
	"github.com/deerflow-sandbox/provisioner/pkg/readywait"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// Version is reported by /api/capabilities; the build sets it.
var Version = "dev"

// API serves the HTTP contract.
type API struct {
	cfg     *config.Config
	auth    *auth.Authenticator
	gate    *fairness.Gate
	ops     api.Operations
	metrics *metrics.Metrics
	now     func() time.Time
	mux     *http.ServeMux
}

// Option customises an API.
type Option func(*API)

// WithGate admits requests through gate, which the replica's other doors
// share: a principal's limits are its limits whichever door it uses.
// Without it the API admits through a Gate of its own, from the
// configuration.
func WithGate(gate *fairness.Gate) Option { return func(a *API) { a.gate = gate } }

// New returns the HTTP front door over ops.
func New(cfg *config.Config, authn *auth.Authenticator, ops api.Operations, m *metrics.Metrics, opts ...Option) *API {
	a := &API{cfg: cfg, auth: authn, ops: ops, metrics: m, now: time.Now, mux: http.NewServeMux()}
	for _, o := range opts {
		o(a)
	}
	if a.gate == nil {
		a.gate = fairness.FromConfig(&cfg.FairnessConfig)
	}
	a.mux.HandleFunc("GET /health", a.health)
	a.mux.Handle("GET /metrics", m.Handler())
	a.route("GET /api/capabilities", "capabilities", a.capabilities)
	a.route("POST /api/sandboxes", "create", a.create)
	a.route("GET /api/sandboxes", "list", a.whole(func(ctx context.Context) (any, error) {
		all, err := a.ops.List(ctx)
		return api.ListResponse{Sandboxes: all, Count: len(all)}, err
	}))
	a.route("GET /api/sandboxes/{id}", "get", a.byID(true, func(ctx context.Context, id string, wait time.Duration) (any, error) {
		return a.ops.Get(ctx, id, wait)
	}))
	a.route("DELETE /api/sandboxes/{id}", "destroy", a.byID(false, func(ctx context.Context, id string, _ time.Duration) (any, error) {
		return api.DestroyResponse{OK: true, SandboxID: id}, a.ops.Destroy(ctx, id)
	}))
	a.route("POST /api/sandboxes/{id}/pause", "pause", a.byID(false, func(ctx context.Context, id string, _ time.Duration) (any, error) {
		return a.ops.Pause(ctx, id)
	}))
	a.route("POST /api/sandboxes/{id}/resume", "resume", a.byID(true, func(ctx context.Context, id string, wait time.Duration) (any, error) {
		return a.ops.Resume(ctx, id, wait)
	}))
	a.route("POST /api/sandboxes/{id}/egress", "egress", a.egress(false))
	a.route("DELETE /api/sandboxes/{id}/egress", "egress", a.egress(true))
	a.route("GET /api/templates", "templates", a.whole(func(ctx context.Context) (any, error) {
		list, err := a.ops.Templates(ctx)
		return api.TemplatesResponse{Templates: list, Count: len(list)}, err
	}))
	a.route("POST /api/reap", "reap", a.whole(func(ctx context.Context) (any, error) { return a.ops.Reap(ctx) }))
	a.mux.HandleFunc("/", a.notFound)
	return a
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// handlerFunc answers one request and returns the status it wrote.
type handlerFunc func(w http.ResponseWriter, r *http.Request) int

// route wraps h with authentication, the principal's share of the
// replica, a deadline and metrics.
func (a *API) route(pattern, operation string, h handlerFunc) {
	a.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := a.now()
		r, principal, code := a.authenticate(w, r, operation)
		if code == 0 {
			code = a.admitted(w, r, principal, h)
		}
		a.metrics.ObserveRequest(operation, "http", code, time.Since(start))
		reqid.Logger(r.Context()).Info("request", "operation", operation, "method", r.Method, "path", r.URL.Path,
			"principal", principal, "status", code, "duration_ms", time.Since(start).Milliseconds())
	})
}

// authenticate admits a request with an API key or an allowed
// service-account token, for a principal that may run operation (see
// package auth), and returns it carrying that principal; a refusal's detail
// says what to fix.
func (a *API) authenticate(w http.ResponseWriter, r *http.Request, operation string) (*http.Request, string, int) {
	d := a.auth.Check(r.Context(), auth.FromRequest(r), operation)
	if !d.Allowed() {
		problem.WriteDetail(w, d.Code, d.Detail)
		return r, "", d.Code
	}
	ctx := api.WithCaller(r.Context(), api.Caller{Principal: d.Principal.Name, Admin: d.Principal.Admin})
	return r.WithContext(ctx), d.Principal.Name, 0
}

// admitted runs h for principal within its share of the replica (package
// fairness), or refuses it with 429 and Retry-After before h reads or
// writes anything.
func (a *API) admitted(w http.ResponseWriter, r *http.Request, principal string, h handlerFunc) int {
	release, refused := a.gate.Admit(r.Context(), principal)
	if refused != nil {
		code, detail := refused.Answer(w.Header())
		problem.WriteDetail(w, code, detail)
		return code
	}
	defer release()
	return h(w, r)
}

func (a *API) health(w http.ResponseWriter, _ *http.Request) {
	problem.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Capabilities is the body of /api/capabilities.
type Capabilities struct {
	LarkCLIInitImage    bool     `json:"lark_cli_init_image"`
	LarkCLIBrokerImage  bool     `json:"lark_cli_broker_image"`
	MaxShellSessions    bool     `json:"max_shell_sessions"`
	ServiceType         string   `json:"service_type"`
	Namespace           string   `json:"namespace"`
	MaxExtraMounts      int      `json:"max_extra_mounts"`
	ExtraMountPaths     []string `json:"extra_mount_paths"`
	MaxSandboxes        int      `json:"max_sandboxes"`
	MaxSandboxesPerUser int      `json:"max_sandboxes_per_user"`
	IdleTimeoutSeconds  int64    `json:"idle_timeout_seconds"`
	MaxLifetimeSeconds  int64    `json:"max_lifetime_seconds"`
	WaitForReady        bool     `json:"wait_for_ready"`
	CloudEvents         bool     `json:"cloudevents"`
	Version             string   `json:"version"`
	// Templates names the sandbox templates a create may ask for (details
	// at GET /api/templates); PauseResume says that ReplicaSet sandboxes
	// can be paused and resumed.
	Templates   []string `json:"templates"`
	PauseResume bool     `json:"pause_resume"`
}

func (a *API) capabilities(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	tmpls, err := a.ops.Templates(ctx)
	if err != nil {
		return a.fail(w, r, err)
	}
	names := make([]string, 0, len(tmpls))
	for _, t := range tmpls {
		if t.Error == "" {
			names = append(names, t.Name)
		}
	}
	problem.WriteJSON(w, http.StatusOK, Capabilities{
		Templates:           names,
		PauseResume:         true,
		LarkCLIInitImage:    a.cfg.LarkCLIInitImage != "",
		LarkCLIBrokerImage:  a.cfg.LarkCLIBrokerImage != "",
		MaxShellSessions:    true,
		ServiceType:         a.cfg.ServiceType,
		Namespace:           a.cfg.Namespace,
		MaxExtraMounts:      10,
		ExtraMountPaths:     config.AllowedExtraMountPaths,
		MaxSandboxes:        a.cfg.MaxSandboxes,
		MaxSandboxesPerUser: a.cfg.MaxSandboxesPerUser,
		IdleTimeoutSeconds:  int64(a.cfg.IdleTimeout / time.Second),
		MaxLifetimeSeconds:  int64(a.cfg.MaxLifetime / time.Second),
		WaitForReady:        true,
		CloudEvents:         !a.cfg.EventsDisabled,
		Version:             Version,
	})
	return http.StatusOK
}

func (a *API) create(w http.ResponseWriter, r *http.Request) int {
	wait, err := readywait.FromQuery(a.cfg.ServerConfig, r.URL.Query().Get("wait"))
	if err != nil {
		return problem.Write(w, err)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxRequestBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem.WriteDetail(w, http.StatusRequestEntityTooLarge, "request body exceeds "+strconv.FormatInt(tooBig.Limit, 10)+" bytes; a create request is a small JSON object")
			return http.StatusRequestEntityTooLarge
		}
		return problem.Write(w, api.Malformedf("could not read the request body: %v", err))
	}
	req, err := api.DecodeCreateRequest(body)
	if err != nil {
		return problem.Write(w, err)
	}
	spec, err := req.Validate(a.cfg.Objects(), a.now())
	if err != nil {
		return problem.Write(w, err)
	}
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, wait)
	defer cancel()
	sb, err := a.ops.Create(ctx, spec, wait)
	if err != nil {
		return a.fail(w, r, err, "sandbox_id", spec.ID)
	}
	problem.WriteJSON(w, http.StatusOK, sb)
	return http.StatusOK
}

// egress grants names to (revoke: revokes names from) the egress of the
// allowlist sandbox the path names: {"allow": [...], "for": "10m"}.
func (a *API) egress(revoke bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) int {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxRequestBodyBytes))
		if err != nil {
			return problem.Write(w, api.Malformedf("could not read the request body: %v", err))
		}
		change, err := api.DecodeEgressRequest(body, revoke)
		if err != nil {
			return problem.Write(w, err)
		}
		ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
		defer cancel()
		id := r.PathValue("id")
		sb, err := a.ops.Egress(ctx, id, change)
		if err != nil {
			return a.fail(w, r, err, "sandbox_id", id)
		}
		problem.WriteJSON(w, http.StatusOK, sb)
		return http.StatusOK
	}
}

// byID answers one operation on the sandbox the path names, under the
// deadline its wait (when the operation takes one: ?wait=) allows.
func (a *API) byID(waits bool, op func(ctx context.Context, id string, wait time.Duration) (any, error)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) int {
		var wait time.Duration
		if waits {
			var err error
			if wait, err = readywait.FromQuery(a.cfg.ServerConfig, r.URL.Query().Get("wait")); err != nil {
				return problem.Write(w, err)
			}
		}
		ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, wait)
		defer cancel()
		id := r.PathValue("id")
		v, err := op(ctx, id, wait)
		if err != nil {
			return a.fail(w, r, err, "sandbox_id", id)
		}
		problem.WriteJSON(w, http.StatusOK, v)
		return http.StatusOK
	}
}

// whole answers one operation on no sandbox in particular.
func (a *API) whole(op func(ctx context.Context) (any, error)) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) int {
		ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
		defer cancel()
		v, err := op(ctx)
		if err != nil {
			return a.fail(w, r, err)
		}
		problem.WriteJSON(w, http.StatusOK, v)
		return http.StatusOK
	}
}

func (a *API) notFound(w http.ResponseWriter, r *http.Request) {
	problem.WriteDetail(w, http.StatusNotFound, "no such endpoint "+r.Method+" "+r.URL.Path+
		"; the API is GET /health, GET /api/capabilities, GET /api/templates, POST|GET /api/sandboxes, GET|DELETE /api/sandboxes/{id}, POST /api/sandboxes/{id}/pause|resume, POST|DELETE /api/sandboxes/{id}/egress, POST /api/reap")
}

// fail logs a failed operation (server-side failures at error level) and answers.
func (a *API) fail(w http.ResponseWriter, r *http.Request, err error, attrs ...any) int {
	code := problem.Write(w, err)
	log := reqid.Logger(r.Context()).With(attrs...)
	if code >= 500 {
		log.Error("operation failed", "status", code, "error", err)
	} else {
		log.Info("operation refused", "status", code, "error", err)
	}
	return code
}

// Package e2b is the E2B-compatible control plane: the REST API that E2B's
// SDK calls at E2B_API_URL (docs/e2b.md), served on the function's own port
// under the path prefix /e2b, so it shares the function's route, TLS,
// authentication, fairness gate and scale to zero, and needs no second
// listener or Knative port (a Knative Service exposes one).
//
// An E2B sandbox is one of our sandboxes: its create is our create (the
// same quota, principals, templates, Events and metrics), its timeout our
// idle timeout, its pause and connect our pause and resume. So the HTTP
// API, CloudEvents and E2B see one set of sandboxes. E2B's X-API-Key is one
// of our principals' API keys, and each endpoint needs the operation it
// maps to (PROVISIONER_PRINCIPAL_OPERATIONS). Answers and errors have
// E2B's shapes: {"code": N, "message": "..."}.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/problem"
	"github.com/deerflow-sandbox/provisioner/pkg/readywait"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// Prefix is the path under which the API is served.
const Prefix = "/e2b"

// EnvdVersion is the E2B envd version the agent (cmd/envd) implements,
// which the SDK reads to know what the agent can do. It is pkg/envd's
// Version (a test keeps the two equal); it is repeated here so that the
// function's binary does not carry the agent's code.
const EnvdVersion = "0.6.4"

// Operations is what the E2B API calls: the sandbox operations every door
// calls, and the timeout only E2B sets (package lifetime).
type Operations interface {
	api.Operations
	SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error)
}

// API serves E2B's control plane.
type API struct {
	cfg         *config.Config
	auth        *auth.Authenticator
	gate        *fairness.Gate
	ops         Operations
	metrics     *metrics.Metrics
	keys        *keyFile
	envdVersion string
	now         func() time.Time
	mux         *http.ServeMux
}

// New returns the E2B API over ops. Without a usable token key
// (E2B_TOKEN_KEY_FILE) every endpoint answers 503 saying so: a sandbox
// whose token cannot be made is one nobody could use safely.
func New(cfg *config.Config, authn *auth.Authenticator, ops Operations, m *metrics.Metrics, gate *fairness.Gate) *API {
	a := &API{cfg: cfg, auth: authn, gate: gate, ops: ops, metrics: m, envdVersion: EnvdVersion, now: time.Now, mux: http.NewServeMux(),
		keys: &keyFile{value: cfg.TokenKey, path: cfg.TokenKeyFile, now: time.Now}}
	for _, p := range []string{"POST /sandboxes", "POST /v2/sandboxes"} {
		a.route(p, "create", a.create)
	}
	a.route("GET /sandboxes", "list", a.list(false))
	a.route("GET /v2/sandboxes", "list", a.list(true))
	a.route("GET /sandboxes/{id}", "get", a.get)
	a.route("DELETE /sandboxes/{id}", "destroy", a.destroy)
	// A timeout moves the deadline a create sets: it needs what a create needs.
	a.route("POST /sandboxes/{id}/timeout", "create", a.timeout)
	a.route("POST /sandboxes/{id}/refreshes", "get", a.refresh)
	a.route("POST /sandboxes/{id}/pause", "pause", a.pause)
	for _, p := range []string{"POST /sandboxes/{id}/resume", "POST /sandboxes/{id}/connect", "POST /v2/sandboxes/{id}/connect"} {
		a.route(p, "resume", a.connect)
	}
	a.route("GET /sandboxes/{id}/metrics", "get", a.sandboxMetrics)
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "%s %s is not part of this provisioner's E2B API (sandboxes only: no template builds, snapshots, volumes or secrets; docs/e2b.md)", r.Method, r.URL.Path)
	})
	return a
}

// ServeHTTP serves a request whose path starts with Prefix.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	http.StripPrefix(Prefix, a.mux).ServeHTTP(w, r)
}

// ServeRoot serves a request for E2B's own API host, api.<E2B_DOMAIN>
// (IsAPIHost), where the paths are E2B's without a prefix.
func (a *API) ServeRoot(w http.ResponseWriter, r *http.Request) {
	a.mux.ServeHTTP(w, r)
}

// IsAPIHost reports whether host (a request's Host, with or without its
// port, in any case) is api.<domain>, E2B's control plane host.
func IsAPIHost(host, domain string) bool {
	if domain == "" {
		return false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.EqualFold(strings.TrimSuffix(host, "."), "api."+domain)
}

// keyFile is the token key, read from its file when first needed and, while
// it cannot be, again at most once a second: the Secret is optional in the
// function's manifest, so an operator may create it after the function
// started, and the next request after that finds it (no restart). Once
// read, the key is kept: a key changed under running sandboxes would
// change their tokens.
type keyFile struct {
	value   string // E2B_TOKEN_KEY: the key itself, which wins over path
	path    string
	now     func() time.Time
	mu      sync.Mutex
	key     access.Key
	problem string
	tried   time.Time
}

func (k *keyFile) get() (access.Key, string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key != nil {
		return k.key, ""
	}
	if now := k.now(); k.tried.IsZero() || now.Sub(k.tried) >= time.Second {
		k.tried = now
		load := func() (access.Key, error) { return access.LoadKey(k.path) }
		if k.value != "" {
			load = func() (access.Key, error) { return access.ParseKey([]byte(k.value)) }
		}
		switch key, err := load(); {
		case k.value != "" && err != nil:
			k.problem = "the E2B API is off: E2B_TOKEN_KEY is no usable key: " + err.Error() + " (docs/e2b.md)"
		case k.path == "" && k.value == "":
			k.problem = "the E2B API is off: neither E2B_TOKEN_KEY nor E2B_TOKEN_KEY_FILE is set (create the Secret sandbox-e2b-key: docs/e2b.md)"
		case err != nil:
			k.problem = "the E2B API is off until its token key can be read: " + err.Error() + " (create the Secret sandbox-e2b-key: docs/e2b.md)"
		default:
			k.key, k.problem = key, ""
		}
	}
	return k.key, k.problem
}

// key is the token key of a request serve admitted (so one that exists).
func (a *API) key() access.Key {
	k, _ := a.keys.get()
	return k
}

// Body is E2B's error body, which the SDK reads the message of.
type Body struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, format string, args ...any) int {
	if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	problem.WriteJSON(w, code, Body{Code: code, Message: fmt.Sprintf(format, args...)})
	return code
}

// fail answers a domain error with its status (problem.Status: 404, 409,
// 429, 503...) in E2B's shape; a 422 (a valid request that cannot succeed)
// is E2B's 400.
func fail(w http.ResponseWriter, err error) int {
	code := problem.Status(err)
	if code == http.StatusUnprocessableEntity {
		code = http.StatusBadRequest
	}
	return writeError(w, code, "%s", api.DetailOf(err))
}

type handler func(w http.ResponseWriter, r *http.Request) int

// route wraps h as the HTTP door wraps its handlers: authentication for
// operation, the principal's share of the replica, metrics and a log line.
func (a *API) route(pattern, operation string, h handler) {
	a.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := a.now()
		code, principal := a.serve(w, r, operation, h)
		a.metrics.ObserveRequest(operation, "e2b", code, time.Since(start))
		reqid.Logger(r.Context()).Info("request", "operation", operation, "method", r.Method, "path", sentPath(r),
			"principal", principal, "status", code, "duration_ms", time.Since(start).Milliseconds())
	})
}

// sentPath is the path the client sent (under Prefix, or at the root of
// api.<E2B_DOMAIN>), for the log.
func sentPath(r *http.Request) string {
	if r.RequestURI == "" {
		return r.URL.Path
	}
	p, _, _ := strings.Cut(r.RequestURI, "?")
	return p
}

func (a *API) serve(w http.ResponseWriter, r *http.Request, operation string, h handler) (int, string) {
	if _, problem := a.keys.get(); problem != "" {
		return writeError(w, http.StatusServiceUnavailable, "%s", problem), ""
	}
	d := a.auth.Check(r.Context(), auth.FromRequest(r), operation)
	if !d.Allowed() {
		return writeError(w, d.Code, "%s", d.Detail), ""
	}
	r = r.WithContext(api.WithCaller(r.Context(), api.Caller{Principal: d.Principal.Name, Admin: d.Principal.Admin}))
	release, refused := a.gate.Admit(r.Context(), d.Principal.Name)
	if refused != nil {
		code, detail := refused.Answer(w.Header())
		return writeError(w, code, "%s", detail), d.Principal.Name
	}
	defer release()
	return h(w, r), d.Principal.Name
}

// readBody decodes a JSON body into v; an empty body is an empty object.
func (a *API) readBody(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxRequestBodyBytes))
	if err != nil {
		return api.Malformedf("could not read the request body (at most %d bytes): %v", a.cfg.MaxRequestBodyBytes, err)
	}
	if len(strings.TrimSpace(string(raw))) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return api.Malformedf("field %q must be a JSON %s, not %s", typeErr.Field, typeErr.Type.Kind(), typeErr.Value)
		}
		return api.Malformedf("the request body is not a JSON object: %v", err)
	}
	return nil
}

// NewSandbox is the body of a create (E2B's NewSandbox).
type NewSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 json.RawMessage   `json:"mcp"`
	Network             json.RawMessage   `json:"network"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	IAM                 json.RawMessage   `json:"iam"`
	AutoResume          *AutoResume       `json:"autoResume"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
}

// AutoResume is E2B's SandboxAutoResumeConfig: whether a paused sandbox
// resumes on its first request. E2B's Python SDK sends it on every create,
// as {"enabled": false}, the default.
type AutoResume struct {
	Enabled *bool `json:"enabled"`
}

// Sandbox is a created or connected sandbox (E2B's Sandbox).
type Sandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken string  `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain"`
}

// Detail is one sandbox as get and list show it (E2B's SandboxDetail and
// ListedSandbox).
type Detail struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       string            `json:"startedAt"`
	EndAt           string            `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
}

// clientID is what E2B calls the cluster node a sandbox runs on; ours run
// wherever the scheduler put them.
const clientID = "kubernetes"

// Limits on metadata, which is stored in one annotation.
const (
	maxMetadataEntries = 32
	maxMetadataKey     = 128
	maxMetadataValue   = 1024
)

func (a *API) create(w http.ResponseWriter, r *http.Request) int {
	var body NewSandbox
	if err := a.readBody(w, r, &body); err != nil {
		return fail(w, err)
	}
	name := body.TemplateID
	if name == "" {
		name = "base" // the SDK's default template, by E2B's name
	}
	if msg := unsupported(body); msg != "" {
		return writeError(w, http.StatusBadRequest, "%s", msg)
	}
	if err := checkMetadata(body.Metadata); err != nil {
		return writeError(w, http.StatusBadRequest, "%s", err.Error())
	}
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, a.cfg.MaxReadyWait)
	defer cancel()
	tmpl, code, msg := a.template(ctx, name)
	if code != 0 {
		return writeError(w, code, "%s", msg)
	}
	if body.AllowInternetAccess != nil && !*body.AllowInternetAccess && tmpl.egress != egress.Isolated {
		return writeError(w, http.StatusBadRequest, "allow_internet_access false: template %q gives its sandboxes %s egress; a sandbox's egress is its template's (sandbox.deerflow.dev/egress: isolated), not the request's", name, tmpl.egress)
	}
	if body.AutoPause != nil && *body.AutoPause && tmpl.IdleAction != template.IdlePause {
		return writeError(w, http.StatusBadRequest, "autoPause: template %q's sandboxes are deleted when their time is up (%s: %s); pausing needs a template of kind ReplicaSet with %s: pause", name, "sandbox.deerflow.dev/idle-action", tmpl.IdleAction, "sandbox.deerflow.dev/idle-action")
	}
	autoResume := body.AutoResume != nil && body.AutoResume.Enabled != nil && *body.AutoResume.Enabled
	if autoResume && (body.AutoPause == nil || !*body.AutoPause) {
		return writeError(w, http.StatusBadRequest, "autoResume: only a sandbox that pauses when its time is up resumes on traffic; create with autoPause true (lifecycle onTimeout 'pause')")
	}
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return fail(w, err)
	}
	id := newID()
	// E2B has no users or threads; every create here names both, and each
	// is owned by one principal (package ownership). The principal's own
	// E2B user and thread keep its E2B sandboxes apart from every other
	// principal's, with one ownership record each (not one per sandbox);
	// where a template keeps DeerFlow's mounts, the principal's E2B
	// sandboxes share that thread's data directory, which a pause keeps.
	owner := OwnerID(c.Records())
	req := api.CreateRequest{SandboxID: id, Template: tmpl.Name, Env: body.EnvVars, UserID: &owner, ThreadID: &owner}
	if body.Timeout != nil && *body.Timeout > 0 {
		req.IdleTimeoutSeconds = body.Timeout
	}
	spec, err := req.Validate(a.cfg.Objects(), a.now())
	if err != nil {
		return fail(w, err)
	}
	spec.Metadata = body.Metadata
	spec.AutoResume = autoResume
	tok := a.tokenSandbox(c.Records(), id, resources.Annotations(spec)[keys.AnnotationCreatedAt])
	spec.EnvdTokenHash = access.Hash(a.key().Token(access.Envd, tok))
	sb, err := a.ops.Create(ctx, spec, a.cfg.MaxReadyWait)
	if err != nil {
		return fail(w, err)
	}
	if sb.WaitTimedOut || !sb.Ready {
		// E2B's create answers a running sandbox; one that is not is removed,
		// not left for the caller, who has no id to remove it by.
		reason := sb.Reason
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.RequestTimeout)
		defer dcancel()
		if err := a.ops.Destroy(dctx, id); err != nil {
			reqid.Logger(ctx).Warn("e2b: removing a sandbox that did not become ready", "sandbox_id", id, "error", err.Error())
		}
		return writeError(w, http.StatusGatewayTimeout, "sandbox %s did not become ready within %s (%s); it was removed", id, a.cfg.MaxReadyWait, orUnknown(reason))
	}
	created := a.sandbox(sb, tok)
	if name != tmpl.Name {
		created.Alias = name // asked for by its alias
	}
	problem.WriteJSON(w, http.StatusCreated, created)
	return http.StatusCreated
}

func orUnknown(s string) string {
	if s == "" {
		return "no reason reported"
	}
	return s
}

// unsupported says which requested feature this provisioner does not offer,
// so the request fails instead of silently running without it. A field
// that only restates E2B's default (autoPauseMemory false, which is what a
// pause here is) asks for nothing and is accepted.
func unsupported(b NewSandbox) string {
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		why  string
	}{
		{"mcp", b.MCP, "the MCP gateway is not offered"},
		{"network", b.Network, "a sandbox's egress is its template's (sandbox.deerflow.dev/egress and egress-allow; grants: POST /api/sandboxes/{id}/egress)"},
		{"volumeMounts", b.VolumeMounts, "E2B volumes are not offered; a template's own volumes and DeerFlow's mounts are"},
		{"iam", b.IAM, "workload identity tokens are not offered"},
	} {
		if len(f.raw) > 0 && string(f.raw) != "null" && string(f.raw) != "{}" && string(f.raw) != "[]" {
			return f.name + ": " + f.why
		}
	}
	if b.AutoPauseMemory != nil && *b.AutoPauseMemory {
		return "autoPauseMemory: a pause here keeps the sandbox's files, not its memory or processes; create with autoPauseMemory false (onTimeout {action: 'pause', keepMemory: false})"
	}
	return ""
}

func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataEntries {
		return errors.New("metadata has " + strconv.Itoa(len(m)) + " entries; at most " + strconv.Itoa(maxMetadataEntries))
	}
	for k, v := range m {
		if k == "" || len(k) > maxMetadataKey {
			return errors.New("metadata key " + strconv.Quote(k) + " must have 1 to " + strconv.Itoa(maxMetadataKey) + " bytes")
		}
		if len(v) > maxMetadataValue {
			return errors.New("metadata value of " + strconv.Quote(k) + " has " + strconv.Itoa(len(v)) + " bytes; at most " + strconv.Itoa(maxMetadataValue))
		}
	}
	return nil
}

// templateInfo is what a create needs to know of its template.
type templateInfo struct {
	template.Summary
	egress egress.Mode
}

// template finds the named template: 404 when there is none, 400 when it
// is refused or does not carry the agent (the SDK could not drive it).
func (a *API) template(ctx context.Context, name string) (templateInfo, int, string) {
	list, err := a.ops.Templates(ctx)
	if err != nil {
		return templateInfo{}, problem.Status(err), api.DetailOf(err)
	}
	i := slices.IndexFunc(list, func(s template.Summary) bool { return s.Name == name })
	if i < 0 {
		// A name no template has may be one's alias; two templates that
		// claim it leave it to neither.
		var claims []string
		for j, s := range list {
			if slices.Contains(s.Aliases, name) {
				i = j
				claims = append(claims, s.Name)
			}
		}
		if len(claims) > 1 {
			return templateInfo{}, http.StatusBadRequest, "template alias '" + name + "' is claimed by the templates " + strings.Join(claims, " and ") + " (sandbox.deerflow.dev/aliases); the operator keeps it on one"
		}
	}
	switch {
	case i < 0:
		return templateInfo{}, http.StatusNotFound, "template '" + name + "' not found: a sandbox template is a PodTemplate labelled sandbox.deerflow.dev/template in the sandboxes' namespace (docs/templates.md)"
	case list[i].Error != "":
		return templateInfo{}, http.StatusBadRequest, "template '" + name + "' is refused: " + list[i].Error
	case !list[i].Envd:
		return templateInfo{}, http.StatusBadRequest, "template '" + name + "' does not carry the agent E2B's SDK talks to: annotate it sandbox.deerflow.dev/envd: \"true\" (docs/e2b.md)"
	}
	mode := a.cfg.DefaultEgress()
	if list[i].Egress != "" {
		mode = egress.Mode(list[i].Egress)
	}
	return templateInfo{Summary: list[i], egress: mode}, 0, ""
}

func (a *API) tokenSandbox(principal, id, createdAt string) access.Sandbox {
	return access.Sandbox{Principal: principal, ID: id, CreatedAt: createdAt}
}

func (a *API) sandbox(sb api.Sandbox, tok access.Sandbox) Sandbox {
	return Sandbox{TemplateID: sb.Template, SandboxID: sb.ID, ClientID: clientID, EnvdVersion: a.envdVersion,
		EnvdAccessToken: a.key().Token(access.Envd, tok), TrafficAccessToken: a.key().Token(access.Traffic, tok), Domain: a.domain()}
}

// domain is what the answers carry as the sandbox's domain: E2B_DOMAIN, or
// null without it (the SDK then keeps its own).
func (a *API) domain() *string {
	if a.cfg.Domain == "" {
		return nil
	}
	d := a.cfg.Domain
	return &d
}

// detail is sb as E2B's get and list show it; withToken adds the envd
// token (get does, as E2B's does; list does not).
func (a *API) detail(sb api.Sandbox, withToken bool) Detail {
	d := Detail{TemplateID: orDefault(sb.Template), SandboxID: sb.ID, ClientID: clientID, StartedAt: sb.CreatedAt, EndAt: sb.ExpiresAt,
		Metadata: sb.Metadata, State: "running", Domain: a.domain()}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	if sb.Status == api.StatusPaused {
		d.State = "paused"
	}
	if sb.Envd {
		d.EnvdVersion = a.envdVersion
		if withToken {
			d.EnvdAccessToken = a.key().Token(access.Envd, a.tokenSandbox(sb.Principal, sb.ID, sb.CreatedAt))
		}
	}
	return d
}

func orDefault(t string) string {
	if t == "" {
		return template.Default
	}
	return t
}

// find gets the caller's sandbox, or answers 404 in E2B's words: another
// principal's, and one whose Pod is gone, are not found.
func (a *API) find(ctx context.Context, w http.ResponseWriter, id string) (api.Sandbox, int) {
	sb, err := a.ops.Get(ctx, id, 0)
	if err == nil {
		sb, err = a.ended(ctx, sb)
	}
	if err == nil && sb.Status == api.StatusNotFound {
		err = &api.Error{Kind: api.KindNotFound, Detail: "sandbox " + id + " not found"}
	}
	if err != nil {
		if api.KindOf(err) == api.KindNotFound {
			return sb, writeError(w, http.StatusNotFound, "sandbox %s not found", id)
		}
		return sb, fail(w, err)
	}
	return sb, 0
}

// ended carries out, at once, what a sandbox whose time is up is due (E2B's
// timeout ends a sandbox at its end, to the second): a sandbox that pauses
// is paused, any other is deleted (then it is not found). The reap would do
// the same on its next pass; an E2B client that asks first gets the
// outcome now, not a sandbox that runs past its end. The router refuses
// such a sandbox's traffic meanwhile (router.Cache).
func (a *API) ended(ctx context.Context, sb api.Sandbox) (api.Sandbox, error) {
	end, err := time.Parse(time.RFC3339, sb.ExpiresAt)
	if err != nil || sb.Status == api.StatusPaused || sb.Status == api.StatusNotFound || !a.now().After(end) {
		return sb, nil
	}
	if sb.Pauses {
		return a.ops.Pause(ctx, sb.ID)
	}
	if err := a.ops.Destroy(ctx, sb.ID); err != nil {
		return sb, err
	}
	sb.Status = api.StatusNotFound
	return sb, nil
}

func (a *API) get(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	sb, code := a.find(ctx, w, r.PathValue("id"))
	if code != 0 {
		return code
	}
	problem.WriteJSON(w, http.StatusOK, a.detail(sb, true))
	return http.StatusOK
}

func (a *API) destroy(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	id := r.PathValue("id")
	if _, code := a.find(ctx, w, id); code != 0 {
		return code
	}
	if err := a.ops.Destroy(ctx, id); err != nil {
		return fail(w, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// timeoutBody is the body of setTimeout and connect: seconds.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

func (a *API) timeout(w http.ResponseWriter, r *http.Request) int {
	var body timeoutBody
	if err := a.readBody(w, r, &body); err != nil {
		return fail(w, err)
	}
	if body.Timeout == nil || *body.Timeout <= 0 {
		return writeError(w, http.StatusBadRequest, "timeout: want a whole number of seconds above 0")
	}
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	id := r.PathValue("id")
	if _, code := a.find(ctx, w, id); code != 0 {
		return code
	}
	if _, err := a.ops.SetTimeout(ctx, id, time.Duration(*body.Timeout)*time.Second); err != nil {
		return fail(w, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// refresh is E2B's keep-alive of older SDKs: it counts as activity, as a
// get does.
func (a *API) refresh(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	if _, code := a.find(ctx, w, r.PathValue("id")); code != 0 {
		return code
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

func (a *API) pause(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	id := r.PathValue("id")
	sb, code := a.find(ctx, w, id)
	if code != 0 {
		return code
	}
	if sb.Status == api.StatusPaused {
		// E2B's answer for a paused sandbox; the SDK returns false for it.
		return writeError(w, http.StatusConflict, "sandbox %s is already paused", id)
	}
	if _, err := a.ops.Pause(ctx, id); err != nil {
		if api.KindOf(err) == api.KindConflict {
			// Ours is a sandbox that cannot pause (a bare Pod); E2B's 409
			// means "already paused", which the SDK would take as success.
			return writeError(w, http.StatusBadRequest, "%s", api.DetailOf(err))
		}
		return fail(w, err)
	}
	w.WriteHeader(http.StatusNoContent)
	return http.StatusNoContent
}

// connect resumes a paused sandbox (and waits for it) or finds a running
// one, sets its timeout if the body names one, and answers its tokens:
// 201 when it was resumed, 200 when it was running.
func (a *API) connect(w http.ResponseWriter, r *http.Request) int {
	var body timeoutBody
	if err := a.readBody(w, r, &body); err != nil {
		return fail(w, err)
	}
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, a.cfg.MaxReadyWait)
	defer cancel()
	id := r.PathValue("id")
	sb, code := a.find(ctx, w, id)
	if code != 0 {
		return code
	}
	if !sb.Envd {
		return writeError(w, http.StatusBadRequest, "sandbox %s does not carry the agent E2B's SDK talks to (its template is not annotated sandbox.deerflow.dev/envd)", id)
	}
	status := http.StatusOK
	if sb.Status == api.StatusPaused {
		var err error
		if sb, err = a.ops.Resume(ctx, id, a.cfg.MaxReadyWait); err != nil {
			return fail(w, err)
		}
		if sb.WaitTimedOut || !sb.Ready {
			return writeError(w, http.StatusGatewayTimeout, "sandbox %s did not become ready within %s after its resume (%s); connect again", id, a.cfg.MaxReadyWait, orUnknown(sb.Reason))
		}
		status = http.StatusCreated
	}
	// A resumed sandbox's end is the connect's timeout from now, as E2B's
	// resume sets it; a running one's only moves later.
	if body.Timeout != nil && *body.Timeout > 0 && (status == http.StatusCreated || a.extends(sb, time.Duration(*body.Timeout)*time.Second)) {
		if _, err := a.ops.SetTimeout(ctx, id, time.Duration(*body.Timeout)*time.Second); err != nil {
			return fail(w, err)
		}
	}
	if sb.Principal == "" || sb.CreatedAt == "" {
		// Resume's answer is built as get's is; both carry the workload's
		// record. One that has none was not made by this provisioner.
		return writeError(w, http.StatusConflict, "sandbox %s records no principal or creation time, so it has no access token", id)
	}
	problem.WriteJSON(w, status, a.sandbox(sb, a.tokenSandbox(sb.Principal, sb.ID, sb.CreatedAt)))
	return status
}

// extends reports whether a connect's timeout d moves sb's end later: a
// connect never shortens a sandbox's life, as E2B's does not (DeerFlow's
// E2B provider connects every minute with the SDK's default 300 s, which
// would otherwise cut a sandbox created for an hour). An end that cannot
// be read is moved.
func (a *API) extends(sb api.Sandbox, d time.Duration) bool {
	end, err := time.Parse(time.RFC3339, sb.ExpiresAt)
	return err != nil || a.now().Add(d).After(end)
}

// sandboxMetrics answers E2B's metrics of a sandbox: none are collected
// yet (docs/e2b.md), so an empty list, once the sandbox is found.
func (a *API) sandboxMetrics(w http.ResponseWriter, r *http.Request) int {
	ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
	defer cancel()
	if _, code := a.find(ctx, w, r.PathValue("id")); code != 0 {
		return code
	}
	problem.WriteJSON(w, http.StatusOK, []struct{}{})
	return http.StatusOK
}

// list answers the caller's sandboxes, filtered by metadata (E2B's
// "k=v&k2=v2", each part URL-encoded), and, in v2, by state, template and
// startedAfter, ordered by start time (order: desc, E2B's default, or asc;
// the id breaks ties) across the whole list, and paged by limit and
// nextToken (a pageToken: where the last page ended).
func (a *API) list(v2 bool) handler {
	return func(w http.ResponseWriter, r *http.Request) int {
		q := r.URL.Query()
		meta, err := parseMetadataQuery(q.Get("metadata"))
		if err != nil {
			return writeError(w, http.StatusBadRequest, "metadata: %v", err)
		}
		states := map[string]bool{"running": true, "paused": true}
		limit, desc := 0, v2
		var after pageToken
		var startedAfter time.Time
		if v2 {
			if s := q.Get("state"); s != "" {
				states = map[string]bool{}
				for _, st := range strings.Split(s, ",") {
					if st != "running" && st != "paused" {
						return writeError(w, http.StatusBadRequest, "state %q: want running or paused", st)
					}
					states[st] = true
				}
			}
			if s := q.Get("limit"); s != "" {
				if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 1000 {
					return writeError(w, http.StatusBadRequest, "limit %q: want a whole number from 1 to 1000", s)
				}
			}
			switch o := q.Get("order"); o {
			case "", "desc":
			case "asc":
				desc = false
			default:
				return writeError(w, http.StatusBadRequest, "order %q: want asc or desc", o)
			}
			if s := q.Get("startedAfter"); s != "" {
				if startedAfter, err = time.Parse(time.RFC3339Nano, s); err != nil {
					return writeError(w, http.StatusBadRequest, "startedAfter %q: want an RFC 3339 time", s)
				}
			}
			if s := q.Get("nextToken"); s != "" {
				if after, err = parsePageToken(s); err != nil {
					return writeError(w, http.StatusBadRequest, "nextToken %q: not one this API gave (%v); list from the start", s, err)
				}
			}
		}
		ctx, cancel := readywait.Deadline(r.Context(), a.cfg.ServerConfig, 0)
		defer cancel()
		all, err := a.ops.List(ctx)
		if err != nil {
			return fail(w, err)
		}
		type listed struct {
			key pageToken
			sb  api.Sandbox
		}
		sorted := make([]listed, len(all))
		for i, sb := range all {
			sorted[i] = listed{pageTokenOf(sb), sb}
		}
		// inOrder compares keys as the list goes: later start first when desc.
		inOrder := func(x, y pageToken) int {
			if desc {
				return y.compare(x)
			}
			return x.compare(y)
		}
		slices.SortFunc(sorted, func(x, y listed) int { return inOrder(x.key, y.key) })
		tmpl := q.Get("template")
		out := []Detail{}
		var last pageToken
		more := false
		for _, l := range sorted {
			d := a.detail(l.sb, false)
			if l.sb.Status == api.StatusNotFound || !states[d.State] || (after.id != "" && inOrder(l.key, after) <= 0) ||
				l.key.started.Before(startedAfter) || (v2 && tmpl != "" && d.TemplateID != tmpl) || !matches(d.Metadata, meta) {
				continue
			}
			if limit > 0 && len(out) == limit {
				more = true
				break
			}
			out, last = append(out, d), l.key
		}
		if more {
			w.Header().Set("X-Next-Token", last.String())
		}
		problem.WriteJSON(w, http.StatusOK, out)
		return http.StatusOK
	}
}

// pageToken is where a page of a list ends: its last sandbox's start
// time and id, the list's order. E2B's nextToken is opaque to its SDK.
type pageToken struct {
	started time.Time
	id      string
}

func pageTokenOf(sb api.Sandbox) pageToken {
	t, _ := time.Parse(time.RFC3339, sb.CreatedAt) // none: the zero time, first in asc
	return pageToken{started: t, id: sb.ID}
}

func (p pageToken) compare(o pageToken) int {
	if c := p.started.Compare(o.started); c != 0 {
		return c
	}
	return strings.Compare(p.id, o.id)
}

// String is the token as the API gives it: base64url of "<unix seconds>.<id>".
func (p pageToken) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.started.Unix(), 10) + "." + p.id))
}

func parsePageToken(s string) (pageToken, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return pageToken{}, errors.New("not base64url")
	}
	secs, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(secs, 10, 64)
	if !ok || err != nil || id == "" {
		return pageToken{}, errors.New("no start time and id")
	}
	return pageToken{started: time.Unix(n, 0).UTC(), id: id}, nil
}

func parseMetadataQuery(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, err
	}
	// The SDK encodes each key and value before it joins them, and the
	// whole once more as the query's value: one unescape is left here.
	m := map[string]string{}
	for k, v := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v[len(v)-1])
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		m[key] = val
	}
	return m, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// OwnerID is the user and thread id of principal's E2B sandboxes: a hash,
// as a principal's name need not be a valid id.
func OwnerID(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return "e2b-" + hex.EncodeToString(sum[:8])
}

// newID is an E2B-looking sandbox id: 20 characters of lower-case base32
// (100 random bits), which is a valid sandbox id here too.
func newID() string {
	b := make([]byte, 13)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))[:20]
}

// Package events is the CloudEvents front door (binary and structured mode),
// and the plain-JSON invoke door that `kn func invoke --format http` uses.
// Both call the same domain operations as the HTTP API.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/uuid"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/problem"
	"github.com/deerflow-sandbox/provisioner/pkg/readywait"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// Request and reply types. A reply type never equals a request type, or a
// broker trigger would feed our replies back to us.
const (
	TypeCreate  = "dev.deerflow.sandbox.create"
	TypeGet     = "dev.deerflow.sandbox.get"
	TypeList    = "dev.deerflow.sandbox.list"
	TypeDestroy = "dev.deerflow.sandbox.destroy"
	TypeReap    = "dev.deerflow.sandbox.reap"
	TypePause   = "dev.deerflow.sandbox.pause"
	TypeResume  = "dev.deerflow.sandbox.resume"
	TypeEgress  = "dev.deerflow.sandbox.egress"
	TypePing    = "dev.knative.sources.ping"

	TypeCreated   = "dev.deerflow.sandbox.created"
	TypeStatus    = "dev.deerflow.sandbox.status"
	TypeListed    = "dev.deerflow.sandbox.listed"
	TypeDestroyed = "dev.deerflow.sandbox.destroyed"
	TypeReaped    = "dev.deerflow.sandbox.reaped"
	TypePaused    = "dev.deerflow.sandbox.paused"
	TypeResumed   = "dev.deerflow.sandbox.resumed"
	TypeEgressed  = "dev.deerflow.sandbox.egressed"
)

// RequestTypes lists the event types we accept, in the order we document them.
var RequestTypes = []string{TypeCreate, TypeGet, TypeList, TypeDestroy, TypePause, TypeResume, TypeEgress, TypeReap, TypePing}

// operation is one request type's behaviour. Every operation, reads and
// reap included, needs a credential.
type operation struct {
	name      string
	replyType string
	run       func(h *Handler, ctx context.Context, data []byte, subject string) (any, string, error)
}

var operations = map[string]operation{
	TypeCreate:  {"create", TypeCreated, (*Handler).create},
	TypeGet:     {"get", TypeStatus, getByID},
	TypeList:    {"list", TypeListed, (*Handler).list},
	TypeDestroy: {"destroy", TypeDestroyed, destroyByID},
	TypeReap:    {"reap", TypeReaped, (*Handler).reap},
	TypePause:   {"pause", TypePaused, pauseByID},
	TypeResume:  {"resume", TypeResumed, resumeByID},
	TypeEgress:  {"egress", TypeEgressed, (*Handler).egress},
	TypePing:    {"reap", TypeReaped, (*Handler).reap},
}

// Handler serves CloudEvents and POST / invocations.
type Handler struct {
	cfg     *config.Config
	auth    *auth.Authenticator
	gate    *fairness.Gate
	ops     api.Operations
	metrics *metrics.Metrics
	source  string
}

// Option customises a Handler.
type Option func(*Handler)

// WithGate admits events through gate, which the replica's other doors
// share: a principal's limits are its limits whichever door it uses.
// Without it the Handler admits through a Gate of its own, from the
// configuration.
func WithGate(gate *fairness.Gate) Option { return func(h *Handler) { h.gate = gate } }

// New returns the events front door over ops.
func New(cfg *config.Config, authn *auth.Authenticator, ops api.Operations, m *metrics.Metrics, opts ...Option) *Handler {
	svc := cfg.KService
	if svc == "" {
		svc = "local"
	}
	h := &Handler{cfg: cfg, auth: authn, ops: ops, metrics: m, source: "/deerflow/sandbox-provisioner/" + svc}
	for _, o := range opts {
		o(h)
	}
	if h.gate == nil {
		h.gate = fairness.FromConfig(&cfg.FairnessConfig)
	}
	return h
}

// IsCloudEvent reports whether r carries a CloudEvent (binary or structured).
func IsCloudEvent(r *http.Request) bool {
	return r.Header.Get("Ce-Specversion") != "" ||
		strings.HasPrefix(strings.ToLower(r.Header.Get("Content-Type")), "application/cloudevents")
}

// ServeHTTP handles one CloudEvent and replies with one.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	opName, code := "unknown", 0
	defer func() { h.metrics.ObserveRequest(opName, "cloudevent", code, time.Since(start)) }()

	if h.cfg.EventsDisabled {
		code = writeDetail(w, http.StatusNotFound, eventsDisabled)
		return
	}
	if r.Method != http.MethodPost {
		code = writeDetail(w, http.StatusMethodNotAllowed, "CloudEvents must be sent with POST")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, h.cfg.MaxRequestBodyBytes)
	ev, err := cehttp.NewEventFromHTTPRequest(r)
	if err != nil {
		code = writeDetail(w, http.StatusBadRequest, "malformed CloudEvent: "+err.Error())
		return
	}
	if err := ev.Validate(); err != nil {
		code = writeDetail(w, http.StatusBadRequest, "invalid CloudEvent: "+err.Error())
		return
	}
	id := reqid.Sanitize(ev.ID())
	w.Header().Set(reqid.Header, id)
	ctx := reqid.Rebind(r.Context(), id)
	log := reqid.Logger(ctx).With("event_type", ev.Type(), "event_source", ev.Source())

	op, ok := operations[ev.Type()]
	if !ok {
		code = writeDetail(w, http.StatusBadRequest, fmt.Sprintf("unsupported event type %q; this function accepts %s",
			api.Truncate(ev.Type()), strings.Join(RequestTypes, ", ")))
		log.Info("event refused", "status", code)
		return
	}
	opName = op.name
	ctx, c, detail, identity, release := h.admit(ctx, w, r, op.name, ev.Source(), ev.Data())
	// Who sent it: behind a Broker, the Trigger's identity.
	log = log.With("identity", identity)
	if c != 0 {
		code = writeDetail(w, c, detail)
		log.Warn("event refused", "status", code, "reason", detail)
		return
	}
	defer release()
	reply, subject, err := op.run(h, ctx, ev.Data(), ev.Subject())
	if err != nil {
		code = problem.Write(w, err)
		log.Info("event failed", "status", code, "error", err)
		return
	}
	out := event.New()
	out.SetID(uuid.NewString())
	out.SetType(op.replyType)
	out.SetSource(h.source)
	out.SetTime(time.Now())
	if subject != "" {
		out.SetSubject(subject)
	}
	if err := out.SetData(event.ApplicationJSON, reply); err != nil {
		code = problem.Write(w, err)
		return
	}
	wctx := ctx
	if strings.HasPrefix(strings.ToLower(r.Header.Get("Content-Type")), "application/cloudevents") {
		wctx = binding.WithForceStructured(ctx)
	}
	code = http.StatusOK
	if err := cehttp.WriteResponseWriter(wctx, binding.ToMessage(&out), code, w); err != nil {
		log.Error("writing the reply event", "error", err)
	}
	log.Info("event handled", "status", code, "subject", subject, "duration_ms", time.Since(start).Milliseconds())
}

const eventsDisabled = "events are disabled on this provisioner (EVENTS_DISABLED=true), on POST / as on CloudEvents"

// admit applies the event settings and authentication, identically for a
// CloudEvent and a POST / invocation: the source allow-list, then a
// credential (X-API-Key, a bearer token, or the api_key field of the JSON
// data for senders that cannot set headers, such as kn func invoke) of a
// principal that may run operation, then that principal's share of the
// replica (package fairness: a refusal sets Retry-After on w). It returns
// ctx carrying that principal, and release, which ends the request's share
// (nil with a refusal).
// An event with a bearer token is judged by the token alone (see
// auth.Credentials.DataKey): a key in its data is never a credential.
//
// identity is the credential's own name when one was verified, so refusals
// and answers can be told apart by sender in the logs.
func (h *Handler) admit(ctx context.Context, w http.ResponseWriter, r *http.Request, operation, source string, data []byte) (context.Context, int, string, string, func()) {
	if len(h.cfg.EventSourceAllowlist) > 0 && !slices.Contains(h.cfg.EventSourceAllowlist, source) {
		return ctx, http.StatusForbidden, fmt.Sprintf("event source %q is not in EVENT_SOURCE_ALLOWLIST", api.Truncate(source)), "", nil
	}
	creds := auth.FromRequest(r)
	creds.DataKey = dataKey(data)
	d := h.auth.Check(ctx, creds, operation)
	if !d.Allowed() {
		return ctx, d.Code, d.Detail, "", nil
	}
	release, refused := h.gate.Admit(ctx, d.Principal.Name)
	if refused != nil {
		code, detail := refused.Answer(w.Header())
		return ctx, code, detail, d.Principal.Identity, nil
	}
	if creds.Token != "" && creds.DataKey != "" {
		// Not the key itself: that it travelled through a Broker, copied to
		// every subscriber on the way, is what the operator must act on.
		reqid.Logger(ctx).Warn("an event with a bearer token also carried api_key in its data; the key was ignored, and it has been seen by everything on the event's way: rotate it",
			"identity", d.Principal.Identity)
	}
	return api.WithCaller(ctx, api.Caller{Principal: d.Principal.Name, Admin: d.Principal.Admin}), 0, "", d.Principal.Identity, release
}

// dataKey reads the api_key field of JSON data. It is never logged or
// echoed: the operations decode their own fields and ignore this one.
func dataKey(data []byte) string {
	var v struct {
		APIKey string `json:"api_key"`
	}
	if json.Unmarshal(data, &v) != nil {
		return ""
	}
	return v.APIKey
}

// idRequest is the data of get and destroy events.
type idRequest struct {
	SandboxID   string   `json:"sandbox_id"`
	WaitSeconds *float64 `json:"wait_seconds"`
}

func (h *Handler) create(ctx context.Context, data []byte, subject string) (any, string, error) {
	req, err := api.DecodeCreateRequest(data)
	if err != nil {
		return nil, "", asInvalid(err)
	}
	var extra struct {
		WaitSeconds *float64 `json:"wait_seconds"`
	}
	_ = json.Unmarshal(data, &extra) // already known to be valid JSON
	if req.SandboxID == "" {
		req.SandboxID = subject
	}
	wait, err := readywait.FromSeconds(h.cfg.ServerConfig, extra.WaitSeconds, "wait_seconds")
	if err != nil {
		return nil, "", err
	}
	spec, err := req.Validate(h.cfg.Objects(), time.Now())
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := readywait.Deadline(ctx, h.cfg.ServerConfig, wait)
	defer cancel()
	sb, err := h.ops.Create(ctx, spec, wait)
	return sb, spec.ID, err
}

// byID is the run of an operation on the sandbox the data or the subject
// names, under the deadline its wait (when it takes one: wait_seconds)
// allows.
func byID(waits bool, op func(ops api.Operations, ctx context.Context, id string, wait time.Duration) (any, error)) func(*Handler, context.Context, []byte, string) (any, string, error) {
	return func(h *Handler, ctx context.Context, data []byte, subject string) (any, string, error) {
		req, err := decodeID(data, subject)
		if err != nil {
			return nil, "", err
		}
		var wait time.Duration
		if waits {
			if wait, err = readywait.FromSeconds(h.cfg.ServerConfig, req.WaitSeconds, "wait_seconds"); err != nil {
				return nil, "", err
			}
		}
		ctx, cancel := readywait.Deadline(ctx, h.cfg.ServerConfig, wait)
		defer cancel()
		v, err := op(h.ops, ctx, req.SandboxID, wait)
		return v, req.SandboxID, err
	}
}

var (
	getByID = byID(true, func(ops api.Operations, ctx context.Context, id string, wait time.Duration) (any, error) {
		return ops.Get(ctx, id, wait)
	})
	destroyByID = byID(false, func(ops api.Operations, ctx context.Context, id string, _ time.Duration) (any, error) {
		return api.DestroyResponse{OK: true, SandboxID: id}, ops.Destroy(ctx, id)
	})
	pauseByID = byID(false, func(ops api.Operations, ctx context.Context, id string, _ time.Duration) (any, error) {
		return ops.Pause(ctx, id)
	})
	resumeByID = byID(true, func(ops api.Operations, ctx context.Context, id string, wait time.Duration) (any, error) {
		return ops.Resume(ctx, id, wait)
	})
)

// egress grants (or, with "revoke": true, revokes) names on one allowlist
// sandbox's egress: {"sandbox_id", "allow", "for", "revoke"}, as the
// HTTP API's POST and DELETE /api/sandboxes/{id}/egress.
func (h *Handler) egress(ctx context.Context, data []byte, subject string) (any, string, error) {
	var req struct {
		SandboxID string `json:"sandbox_id"`
		Revoke    bool   `json:"revoke"`
	}
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, "", api.Malformedf("the event's data must be a JSON object such as {\"sandbox_id\": \"abc\", \"allow\": [\"pypi.org\"], \"for\": \"10m\"}: %v", err)
	}
	if req.SandboxID == "" {
		req.SandboxID = subject
	}
	var body map[string]json.RawMessage
	_ = json.Unmarshal(data, &body) // valid JSON, checked above
	// The rest is the grant; what the doors themselves read is not.
	for _, k := range []string{"sandbox_id", "revoke", "operation", "source", "api_key"} {
		delete(body, k)
	}
	rest, _ := json.Marshal(body)
	change, err := api.DecodeEgressRequest(rest, req.Revoke)
	if err != nil {
		return nil, req.SandboxID, err
	}
	ctx, cancel := readywait.Deadline(ctx, h.cfg.ServerConfig, 0)
	defer cancel()
	sb, err := h.ops.Egress(ctx, req.SandboxID, change)
	return sb, req.SandboxID, err
}

func (h *Handler) list(ctx context.Context, _ []byte, _ string) (any, string, error) {
	ctx, cancel := readywait.Deadline(ctx, h.cfg.ServerConfig, 0)
	defer cancel()
	all, err := h.ops.List(ctx)
	return api.ListResponse{Sandboxes: all, Count: len(all)}, "", err
}

func (h *Handler) reap(ctx context.Context, _ []byte, _ string) (any, string, error) {
	ctx, cancel := readywait.Deadline(ctx, h.cfg.ServerConfig, 0)
	defer cancel()
	res, err := h.ops.Reap(ctx)
	return res, "", err
}

// decodeID reads {"sandbox_id"} from data, falling back to the event subject.
func decodeID(data []byte, subject string) (idRequest, error) {
	var req idRequest
	if len(strings.TrimSpace(string(data))) > 0 {
		if err := json.Unmarshal(data, &req); err != nil {
			return req, api.Invalidf("event data must be a JSON object like {\"sandbox_id\": \"...\"}: %v", err)
		}
	}
	if req.SandboxID == "" {
		req.SandboxID = subject
	}
	if req.SandboxID == "" {
		return req, api.Invalidf("sandbox_id is required, in the data or as the event subject")
	}
	return req, api.ValidateID(req.SandboxID)
}

// asInvalid reports undecodable event data as invalid data (422): the event
// itself was well-formed, its payload was not.
func asInvalid(err error) error {
	var e *api.Error
	if errors.As(err, &e) && e.Kind == api.KindMalformed {
		return &api.Error{Kind: api.KindInvalid, Detail: "event data: " + e.Detail}
	}
	return err
}

func writeDetail(w http.ResponseWriter, code int, detail string) int {
	problem.WriteDetail(w, code, detail)
	return code
}

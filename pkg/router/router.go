// Package router is the sandbox router of E2B's data plane (docs/e2b.md):
// one address for every sandbox (E2B_SANDBOX_URL), which E2B's SDK names a
// sandbox and port to in the E2b-Sandbox-Id and E2b-Sandbox-Port headers,
// or E2B's own addressing, <port>-<sandbox id>.<E2B_DOMAIN> in the Host.
// The router finds the sandbox's Pod in an informer's cache (Cache), checks
// the sandbox's token for that port (pkg/access) and forwards the request to
// the Pod's IP, streaming both ways.
//
// Every sandbox is secure: the agent's port (EnvdPort) needs the envd token
// in X-Access-Token, any other port the traffic token in
// e2b-traffic-access-token. Nothing reaches a sandbox without its token.
package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/bounded"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// The headers the router reads. Go canonicalizes names, so any case
// matches.
const (
	HeaderSandboxID    = "E2b-Sandbox-Id"
	HeaderSandboxPort  = "E2b-Sandbox-Port"
	HeaderAccessToken  = "X-Access-Token"
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
)

// DefaultDialTimeout bounds the connection to a sandbox's Pod: a Pod IP that
// does not answer (a Pod gone since the cache last heard) fails fast.
const DefaultDialTimeout = 2 * time.Second

// DefaultCacheGrace is how long a request waits for the router's caches
// to show a sandbox they do not show yet, or its Pod running: a create
// answers once its Pod is Ready, and the SDK's first call may reach a
// router replica whose watch has not delivered that yet.
const DefaultCacheGrace = 2 * time.Second

// Options configure a Handler.
type Options struct {
	Resolver Resolver
	// CacheGrace is how long an unknown or not running sandbox is looked
	// up again (every 25 ms) before the request is refused (0: not at all;
	// the command sets DefaultCacheGrace).
	CacheGrace time.Duration
	// Key makes the tokens the router checks (the function's).
	Key     access.Key
	Log     *slog.Logger
	Metrics *Metrics
	// Domain is E2B_DOMAIN: a request whose Host is
	// <port>-<sandbox id>.<Domain> is for that sandbox and port, whatever
	// its headers say ("": the headers alone name it).
	Domain string
	// DialTimeout bounds the connection to the sandbox (DefaultDialTimeout).
	DialTimeout time.Duration
	// Dial replaces the dialer (tests); it must honour ctx.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Waker resumes a paused sandbox that resumes on traffic, for a
	// request that carries its token (nil: none is woken; such a sandbox
	// answers as one not found, as a paused one does).
	Waker Waker
	// WakeHold bounds how long a request waits for the sandbox it woke
	// (DefaultWakeHold); MaxHeld bounds the requests waiting for one
	// sandbox (DefaultMaxHeld).
	WakeHold time.Duration
	MaxHeld  int
	// Fairness shares this replica between principals (package fairness,
	// DefaultFairness): each may start so many requests a second (faster
	// ones wait their turn briefly) and have so many open (streams
	// included); past either, 429. Without it one tenant's flood, even of
	// refused requests, takes the CPU the others' requests need.
	Fairness fairness.Limits
	// RefusalDelay holds a request that Fairness refuses for so long
	// before its 429 (DefaultRefusalDelay; at most MaxHeldRefusals a
	// principal, past which they are answered at once), so that a client
	// that ignores Retry-After cannot turn refusals into a flood of their
	// own: each refusal is as cheap as a request, and a loop of them took
	// the CPU the other tenants' requests need.
	RefusalDelay    time.Duration
	MaxHeldRefusals int
}

// DefaultRefusalDelay and DefaultMaxHeldRefusals are Options'
// RefusalDelay's and MaxHeldRefusals' defaults: a refused client waits
// what its Retry-After (one second) asks anyway.
const (
	DefaultRefusalDelay    = time.Second
	DefaultMaxHeldRefusals = 256
)

// DefaultFairness is Options.Fairness's default: more open requests than
// any one agent's streams (each command, PTY and watch is one), and a rate
// far above what agents send (a command, a file call or a PTY's input is
// one request each) yet far below what a replica serves on two cores.
// More replicas give a principal more.
var DefaultFairness = fairness.Limits{RequestsPerSecond: 1000, Burst: 1000, MaxInProgress: 512}

// Handler routes requests to sandboxes.
type Handler struct {
	opts  Options
	proxy *httputil.ReverseProxy
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	// client calls the agents' /init, through the proxy's transport.
	client *http.Client
	inited agents
	wakes  wakes
	// gate admits each request by its principal (Fairness); held counts
	// the refused requests held per principal (RefusalDelay).
	gate *fairness.Gate
	held bounded.Counts
}

// agents are the agents (by Pod UID) this replica has given their token's
// hash, so it does so once per Pod, not per request. Bounded: when full it
// starts again, which costs each agent one more idempotent /init.
type agents struct {
	mu   sync.Mutex
	uids map[string]struct{}
}

const maxInited = 4096

func (a *agents) has(uid string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.uids[uid]
	return ok
}

func (a *agents) add(uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.uids == nil || len(a.uids) >= maxInited {
		a.uids = map[string]struct{}{}
	}
	a.uids[uid] = struct{}{}
}

// New returns a Handler.
func New(o Options) *Handler {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.WakeHold <= 0 {
		o.WakeHold = DefaultWakeHold
	}
	if o.MaxHeld <= 0 {
		o.MaxHeld = DefaultMaxHeld
	}
	if o.Fairness == (fairness.Limits{}) {
		o.Fairness = DefaultFairness
	}
	if o.RefusalDelay == 0 {
		o.RefusalDelay = DefaultRefusalDelay
	}
	if o.MaxHeldRefusals <= 0 {
		o.MaxHeldRefusals = DefaultMaxHeldRefusals
	}
	dial := o.Dial
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	timeout := o.DialTimeout
	h := &Handler{opts: o, dial: dial, gate: fairness.New(o.Fairness)}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: rewrite,
		Transport: &http.Transport{
			// Never a proxy from the environment: the router talks to Pod
			// IPs only.
			Proxy: nil,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return dialAgain(ctx, dial, network, addr, timeout)
			},
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
			// Bodies are streamed as they come: the transport's own
			// buffers only.
			DisableCompression: true,
		},
		// Server-streamed Connect responses (process output, watches) and
		// downloads reach the client as the sandbox writes them.
		FlushInterval: -1,
		ModifyResponse: func(res *http.Response) error {
			if rt, ok := res.Request.Context().Value(routeKey{}).(*route); ok {
				rt.upstream, rt.upstreamAt = res.StatusCode, time.Now()
			}
			return nil
		},
		ErrorHandler: h.upstreamError,
		ErrorLog:     slog.NewLogLogger(o.Log.Handler(), slog.LevelWarn),
	}
	h.client = &http.Client{Transport: h.proxy.Transport, Timeout: 5 * time.Second}
	return h
}

// initAgent gives a pooled sandbox's agent its token's hash before the
// first call this replica forwards to it (envd.InitPath): a pooled Pod is
// made before its sandbox, so before its token, and its agent starts
// without one. token is the one admit has just checked, so the hash is the
// sandbox's. An agent that has its hash already (a cold create's, or an
// earlier /init's) answers 204 or 409 and keeps it; either way the call
// that follows is judged by the agent's own hash.
func (h *Handler) initAgent(ctx context.Context, rt *route, token string) error {
	if rt.target.UID == "" || h.inited.has(rt.target.UID) {
		return nil
	}
	body, _ := json.Marshal(map[string]string{"accessTokenHash": access.Hash(token)})
	u := "http://" + net.JoinHostPort(rt.target.IP, strconv.Itoa(EnvdPort)) + "/init"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(reqid.Header, rt.request)
	resp, err := h.client.Do(req)
	if err != nil {
		return fmt.Errorf("giving the agent its token: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 500 {
		return fmt.Errorf("giving the agent its token: %s", resp.Status)
	}
	h.inited.add(rt.target.UID)
	return nil
}

// firstDialAttempt is how long the first connection attempt to a sandbox
// waits for an answer before a fresh one is made; each next waits twice as
// long, all within the dial timeout.
const firstDialAttempt = 250 * time.Millisecond

// dialAgain connects within timeout, starting over with a fresh connection
// when an attempt hears nothing (a SYN dropped: the node's policy agent may
// judge a Pod made a moment ago before it has seen the Pod's labels, and
// the kernel would resend that SYN only after a second), never after an
// answer such as a refusal, which it returns at once.
func dialAgain(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for attempt := firstDialAttempt; ; attempt *= 2 {
		actx, acancel := context.WithTimeout(ctx, attempt)
		c, err := dial(actx, network, addr)
		acancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			return c, err
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

type routeKey struct{}

// route is what ServeHTTP decided, for rewrite and upstreamError.
type route struct {
	id      string
	port    int
	kind    string
	target  Target
	request string // the request id
	// upstream is the sandbox's status: an upgrade (101) is answered on
	// the hijacked connection, past the recorder.
	upstream   int
	upstreamAt time.Time
}

func rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(*route)
	pr.SetURL(&url.URL{Scheme: "http", Host: net.JoinHostPort(rt.target.IP, strconv.Itoa(rt.port))})
	// Rewrite has dropped the client's X-Forwarded-* headers (and this
	// drops its Forwarded): what the sandbox sees is the router's own,
	// naming the real peer.
	h := pr.Out.Header
	h.Del("Forwarded")
	pr.SetXForwarded()
	// E2B's headers (the routing ones, the traffic token) are the
	// router's alone. The envd token goes on to the agent (which checks it
	// too) and to no other port.
	for k := range h {
		if strings.HasPrefix(k, "E2b-") {
			delete(h, k)
		}
	}
	if rt.kind != KindEnvd {
		h.Del(HeaderAccessToken)
	}
	h.Set(reqid.Header, rt.request)
}

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := reqid.Sanitize(r.Header.Get(reqid.Header))
	rt := &route{kind: KindNone, request: id}
	rec := &recorder{ResponseWriter: w}
	w.Header().Set(reqid.Header, id)
	h.opts.Metrics.flight(1)
	defer func() {
		h.opts.Metrics.flight(-1)
		switch {
		case rec.code == 0 && rt.upstream == http.StatusSwitchingProtocols:
			rec.code, rec.at = rt.upstream, rt.upstreamAt
		case rec.code == 0:
			// Nothing answered (a panic below, or an aborted stream).
			rec.code, rec.at = http.StatusBadGateway, time.Now()
		}
		h.opts.Metrics.observe(strconv.Itoa(rec.code), rt.kind, rec.at.Sub(start).Seconds())
	}()
	log := h.opts.Log.With("request_id", id)
	status, msg, detail := h.admit(r, rt)
	if status == 0 {
		release, refused := h.gate.Admit(r.Context(), rt.target.Sandbox.Principal)
		if refused == nil {
			defer release()
		} else {
			status, msg = refused.Answer(rec.Header())
			detail = msg
			h.holdRefusal(r.Context(), rt.target.Sandbox.Principal)
		}
	}
	if status != 0 {
		lvl := slog.LevelInfo
		if status >= 500 && msg != SandboxNotFound {
			lvl = slog.LevelWarn
		}
		log.Log(r.Context(), lvl, "refused", "sandbox", rt.id, "port", rt.port, "status", status, "reason", detail)
		if msg == SandboxNotFound {
			writeBody(rec, status, errorBody{Code: status, Message: msg, SandboxID: rt.id})
		} else {
			writeError(rec, status, msg)
		}
		return
	}
	if rt.kind == KindEnvd {
		if err := h.initAgent(r.Context(), rt, r.Header.Get(HeaderAccessToken)); err != nil {
			log.Warn("refused", "sandbox", rt.id, "port", rt.port, "status", http.StatusBadGateway, "reason", err.Error())
			writeError(rec, http.StatusBadGateway, fmt.Sprintf("sandbox %s's agent did not answer: %s", rt.id, brief(err)))
			return
		}
	}
	if r.ProtoMajor == 1 {
		// An HTTP/1 handler may not read the request after writing the
		// response unless told it may: a bidirectional stream needs both.
		_ = http.NewResponseController(rec).EnableFullDuplex()
	}
	ctx := context.WithValue(r.Context(), routeKey{}, rt)
	h.proxy.ServeHTTP(rec, r.WithContext(ctx))
	log.Debug("forwarded", "sandbox", rt.id, "pod", rt.target.Pod, "port", rt.port, "status", rec.code,
		"path", r.URL.Path, "seconds", time.Since(start).Seconds())
}

// admit decides a request: 0 to forward it, or the status and message to
// answer with (and a detail for the log).
func (h *Handler) admit(r *http.Request, rt *route) (int, string, string) {
	id, port, err := target(r, h.opts.Domain)
	if err != nil {
		return http.StatusBadRequest, err.Error(), err.Error()
	}
	rt.id, rt.port, rt.kind = id, port, KindTraffic
	kind, header := access.Traffic, HeaderTrafficToken
	if port == EnvdPort {
		rt.kind, kind, header = KindEnvd, access.Envd, HeaderAccessToken
	}
	t, err := h.resolve(r.Context(), id)
	if errors.Is(err, ErrPaused) && h.opts.Waker != nil {
		// The token first: a request without it wakes nothing.
		if code, msg, detail := h.authorize(r, rt, kind, header, t); code != 0 {
			return code, msg, detail
		}
		t, err = h.awaitWake(r.Context(), rt, t, err)
	}
	switch {
	case errors.Is(err, errTooManyHeld):
		return http.StatusTooManyRequests, fmt.Sprintf("sandbox %s is resuming and %d requests already wait for it; retry", id, h.opts.MaxHeld), err.Error()
	case errors.Is(err, errWake):
		return http.StatusServiceUnavailable, fmt.Sprintf("sandbox %s could not be resumed: %s; retry", id, strings.TrimPrefix(err.Error(), errWake.Error()+": ")), err.Error()
	case errors.Is(err, errWakeTimeout):
		return http.StatusServiceUnavailable, fmt.Sprintf("sandbox %s did not resume within %s; retry", id, h.opts.WakeHold), err.Error()
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrPaused):
		// E2B's answer for a sandbox gone or never made, on every port:
		// its SDK reads a 502 from the agent as the sandbox having ended.
		return http.StatusBadGateway, SandboxNotFound, err.Error()
	case errors.Is(err, ErrNotRunning):
		return http.StatusBadGateway, fmt.Sprintf("sandbox %s is not running", id), err.Error()
	case err != nil:
		return http.StatusBadGateway, fmt.Sprintf("sandbox %s cannot be resolved now", id), err.Error()
	}
	rt.target = t
	return h.authorize(r, rt, kind, header, t)
}

// authorize checks the request's token for t, then t's port: 0 to go on,
// or the status and message to answer with (and a detail for the log).
func (h *Handler) authorize(r *http.Request, rt *route, kind access.Kind, header string, t Target) (int, string, string) {
	id, port := rt.id, rt.port
	// The token before the port: a caller without it learns nothing of the
	// sandbox's ports. A signed file URL carries no token: its signature,
	// checked here, stands for the envd token, which the agent is then
	// handed.
	if kind == access.Envd && signed(r) && t.Sandbox.Principal != "" && t.Sandbox.CreatedAt != "" {
		token, err := signedToken(r, h.opts.Key, t.Sandbox, time.Now())
		if err != nil {
			return http.StatusUnauthorized, err.Error(), err.Error()
		}
		r.Header.Set(HeaderAccessToken, token)
	}
	got, err := single(r.Header, header)
	switch {
	case err != nil:
		return http.StatusUnauthorized, fmt.Sprintf("sandbox %s port %d needs its token in %s", id, port, header), err.Error()
	case t.Sandbox.Principal == "" || t.Sandbox.CreatedAt == "":
		// No principal or creation time: no token was ever issued for it
		// (a sandbox from before E2B, or DeerFlow's own provisioner's).
		return http.StatusUnauthorized, fmt.Sprintf("sandbox %s has no E2B tokens", id), "the Pod lacks the principal or created-at annotation"
	case !h.opts.Key.Check(kind, t.Sandbox, got):
		return http.StatusUnauthorized, fmt.Sprintf("wrong %s for sandbox %s", header, id), "wrong token"
	}
	if !t.Exposes(int(port)) {
		msg := fmt.Sprintf("sandbox %s exposes no port %d; its ports: %s", id, port, t.PortList())
		return http.StatusNotFound, msg, msg
	}
	return 0, "", ""
}

// The ways a wake fails.
var (
	errWake        = errors.New("the resume failed")
	errWakeTimeout = errors.New("the sandbox did not resume in time")
)

// awaitWake resumes the sandbox of rt, paused or resuming as t and err
// (Resolve's answer) say (once for every request that asks at the same
// time), and waits, within WakeHold, until its next Pod is Ready, or runs
// and takes connections on the request's port (listening): the kubelet
// reports Ready up to a probe period after that, as Knative's activator
// knows, which probes a revision's Pods itself. A sandbox whose Service
// goes meanwhile is ErrGone.
func (h *Handler) awaitWake(ctx context.Context, rt *route, t Target, err error) (Target, error) {
	release, herr := h.wakes.hold(rt.id, h.opts.MaxHeld)
	if herr != nil {
		return Target{}, herr
	}
	defer release()
	start := time.Now()
	outcome := "failed"
	defer func() { h.opts.Metrics.woke(outcome, time.Since(start).Seconds()) }()
	ctx, cancel := context.WithTimeout(ctx, h.opts.WakeHold)
	defer cancel()
	for {
		if errors.Is(err, ErrPaused) && t.Paused {
			werr := h.wakes.wake(h.opts.Waker, rt.id, h.opts.WakeHold)
			switch {
			case errors.Is(werr, ErrNotFound):
				outcome = "gone"
				return Target{}, werr
			case werr != nil:
				return Target{}, fmt.Errorf("%w: %w", errWake, werr)
			}
		}
		switch {
		case errors.Is(err, ErrPaused) && t.Failure != "":
			return Target{}, fmt.Errorf("%w: %s", errWake, t.Failure)
		case err == nil && (t.Ready || h.listening(ctx, t, rt.port)):
			outcome = "resumed"
			h.opts.Log.Info("resumed on traffic", "request_id", rt.request, "sandbox", rt.id, "pod", t.Pod, "seconds", time.Since(start).Seconds())
			return t, nil
		case errors.Is(err, ErrGone) || err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrNotRunning) && !errors.Is(err, ErrPaused):
			if errors.Is(err, ErrGone) {
				outcome = "gone"
			}
			return t, err
		}
		select {
		case <-ctx.Done():
			outcome = "timeout"
			return Target{}, errWakeTimeout
		case <-time.After(50 * time.Millisecond):
		}
		t, err = h.opts.Resolver.Resolve(rt.id)
	}
}

// holdRefusal waits RefusalDelay (or until the client leaves) before a
// refusal of principal's is answered, unless MaxHeldRefusals of its
// refusals are held already.
func (h *Handler) holdRefusal(ctx context.Context, principal string) {
	if h.opts.RefusalDelay < 0 {
		return
	}
	release, ok := h.held.Take(principal, h.opts.MaxHeldRefusals)
	if !ok {
		return
	}
	defer release()
	t := time.NewTimer(h.opts.RefusalDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// listening says whether t's running Pod accepts a connection on port
// (one dial, closed at once, bounded by listenProbe).
func (h *Handler) listening(ctx context.Context, t Target, port int) bool {
	if t.IP == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, listenProbe)
	defer cancel()
	c, err := h.dial(ctx, "tcp", net.JoinHostPort(t.IP, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// listenProbe bounds one dial of listening: a Pod on the node answers in
// milliseconds, or refuses.
const listenProbe = 250 * time.Millisecond

// resolve finds the sandbox's Pod, waiting up to CacheGrace for caches
// that do not show it, or show it not running, to catch up. Bounded, and
// only for those two answers: a cache that fails answers at once.
func (h *Handler) resolve(ctx context.Context, id string) (Target, error) {
	deadline := time.Now().Add(h.opts.CacheGrace)
	for {
		t, err := h.opts.Resolver.Resolve(id)
		if err == nil || !(errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotRunning)) || !time.Now().Before(deadline) {
			return t, err
		}
		select {
		case <-ctx.Done():
			return t, err
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// upstreamError answers a request the sandbox did not take: 502, unless the
// client left first.
func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(routeKey{}).(*route)
	if rt == nil {
		rt = &route{}
	}
	log := h.opts.Log.With("request_id", rt.request, "sandbox", rt.id, "pod", rt.target.Pod, "port", rt.port)
	if r.Context().Err() != nil {
		log.Debug("client went away", "error", err.Error())
		// Nobody reads this; counted as nginx's 499 (client closed).
		w.WriteHeader(499)
		return
	}
	log.Warn("sandbox unreachable", "error", err.Error())
	writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s port %d is unreachable: %s", rt.id, rt.port, brief(err)))
}

// brief is err without the address the router dialled: the client needs to
// know the sandbox did not answer, not its Pod IP.
func brief(err error) string {
	var op *net.OpError
	if errors.As(err, &op) {
		var to interface{ Timeout() bool }
		if errors.As(err, &to) && to.Timeout() {
			return "no answer in time"
		}
		if op.Op == "dial" {
			return "connection refused or unreachable"
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer in time"
	}
	return "the connection failed"
}

// single reads a header that must have one value, across repeats and
// comma-joined lists (a fetch that appends a header twice joins them).
func single(h http.Header, name string) (string, error) {
	var v string
	for _, line := range h.Values(name) {
		for f := range strings.SplitSeq(line, ",") {
			f = strings.TrimSpace(f)
			switch {
			case f == "":
			case v == "":
				v = f
			case v != f:
				return "", fmt.Errorf("header %s has more than one value", name)
			}
		}
	}
	if v == "" {
		return "", fmt.Errorf("header %s is missing", name)
	}
	return v, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// SandboxNotFound is E2B's message for a sandbox that is not there (gone,
// or never made), which clients such as DeerFlow's E2B provider match.
const SandboxNotFound = "The sandbox was not found"

// errorBody is E2B's error shape: its SDK reads message.
type errorBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId,omitempty"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeBody(w, code, errorBody{Code: code, Message: msg})
}

func writeBody(w http.ResponseWriter, code int, body errorBody) {
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// recorder notes the status and when the header went, for the metrics.
// Unwrap lets http.ResponseController (the proxy's flushes, upgrades, full
// duplex) reach the server's writer.
type recorder struct {
	http.ResponseWriter
	code int
	at   time.Time
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		r.code, r.at = code, time.Now()
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code, r.at = http.StatusOK, time.Now()
	}
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if r.code == 0 {
		r.code, r.at = http.StatusOK, time.Now()
	}
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

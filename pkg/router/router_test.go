package router

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// counter reads a counter's value.
func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// counterReaches reads a counter until it is want (bounded: 2 s), and
// returns its last value: the router counts a request once its handler
// returns, which may be just after the client has read the answer.
func counterReaches(t *testing.T, c prometheus.Counter, want float64) float64 {
	t.Helper()
	n := counter(t, c)
	for i := 0; i < 100 && n != want; i++ {
		time.Sleep(20 * time.Millisecond)
		n = counter(t, c)
	}
	return n
}

var testKey = access.Key(strings.Repeat("k", 40))

// fakeResolver knows sandboxes by id; an id mapped to an error fails so.
type fakeResolver map[string]any

func (f fakeResolver) Resolve(id string) (Target, error) {
	switch v := f[id].(type) {
	case Target:
		return v, nil
	case error:
		return Target{}, fmt.Errorf("sandbox %s: %w", id, v)
	}
	return Target{}, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
}

var abc = Target{
	Pod: "sandbox-abc", IP: "10.244.0.7", Envd: true, Ports: []int32{3000, 8080},
	Sandbox: access.Sandbox{Principal: "alice", ID: "abc", CreatedAt: "2026-11-28T11:00:00Z"},
}

var (
	envdToken    = testKey.Token(access.Envd, abc.Sandbox)
	trafficToken = testKey.Token(access.Traffic, abc.Sandbox)
)

// harness is a router in front of one upstream, which every dial reaches
// whatever address the router dials (recorded in dialed).
type harness struct {
	router   *httptest.Server
	upstream *httptest.Server
	metrics  *Metrics
	hits     atomic.Int32
	mu       sync.Mutex
	dialed   []string
}

func newHarness(t *testing.T, upstream http.HandlerFunc, mod func(*Options)) *harness {
	t.Helper()
	h := &harness{}
	h.upstream = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		upstream(w, r)
	}))
	t.Cleanup(h.upstream.Close)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h.metrics = m
	up := h.upstream.Listener.Addr().String()
	o := Options{
		Resolver: fakeResolver{
			"abc":   abc,
			"bare":  Target{Pod: "sandbox-bare", IP: "10.244.0.8", Ports: []int32{8080}, Sandbox: access.Sandbox{Principal: "bob", ID: "bare", CreatedAt: "2026-11-28T11:00:00Z"}},
			"old":   Target{Pod: "sandbox-old", IP: "10.244.0.9", Envd: true, Sandbox: access.Sandbox{ID: "old"}},
			"sleep": ErrNotRunning,
			"flaky": fmt.Errorf("the cache broke"),
		},
		Key:     testKey,
		Log:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: m,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			h.mu.Lock()
			h.dialed = append(h.dialed, addr)
			h.mu.Unlock()
			return (&net.Dialer{}).DialContext(ctx, network, up)
		},
	}
	if mod != nil {
		mod(&o)
	}
	h.router = httptest.NewServer(New(o))
	t.Cleanup(h.router.Close)
	return h
}

func (h *harness) request(t *testing.T, method string, body io.Reader, hdr map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, h.router.URL+"/process.Process/Start?x=1", body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

func envd(id string) map[string]string {
	return map[string]string{HeaderSandboxID: id, HeaderSandboxPort: "49983", HeaderAccessToken: envdToken}
}

func TestForwardsByHeaders(t *testing.T) {
	type seen struct {
		Method, Path, Query, Body, Host string
		Header                          http.Header
	}
	got := make(chan seen, 1)
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.URL.RawQuery, string(b), r.Host, r.Header.Clone()}
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "from the sandbox")
	}, nil)
	tokens := map[string]string{HeaderAccessToken: envdToken, HeaderTrafficToken: trafficToken}
	rows := []struct {
		name       string
		port       string
		dial       string
		keepHeader string // the token header the sandbox gets
		dropHeader string // the one it does not
	}{
		{"the agent", "49983", "10.244.0.7:49983", HeaderAccessToken, HeaderTrafficToken},
		{"an app's port", "3000", "10.244.0.7:3000", "", HeaderAccessToken},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			req := h.request(t, http.MethodPost, strings.NewReader("hello"), map[string]string{
				HeaderSandboxID: "abc", HeaderSandboxPort: r.port,
				"X-Forwarded-For": "6.6.6.6", "Forwarded": "for=6.6.6.6", reqid.Header: "req-1",
				"Content-Type": "application/json", "E2b-Sandbox-Domain": "e2b.app",
			})
			for k, v := range tokens {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTeapot || string(body) != "from the sandbox" || resp.Header.Get("X-Upstream") != "yes" {
				t.Fatalf("answer %d %q %v; want the sandbox's 418", resp.StatusCode, body, resp.Header)
			}
			if resp.Header.Get(reqid.Header) != "req-1" {
				t.Errorf("X-Request-Id = %q; want the client's", resp.Header.Get(reqid.Header))
			}
			s := <-got
			if d := cmp.Diff(seen{Method: "POST", Path: "/process.Process/Start", Query: "x=1", Body: "hello", Host: r.dial},
				seen{s.Method, s.Path, s.Query, s.Body, s.Host, nil}); d != "" {
				t.Errorf("the sandbox got (-want +got):\n%s", d)
			}
			h.mu.Lock()
			dialed := h.dialed[len(h.dialed)-1]
			h.mu.Unlock()
			if dialed != r.dial {
				t.Errorf("dialled %s; want %s", dialed, r.dial)
			}
			for _, k := range []string{HeaderSandboxID, HeaderSandboxPort, r.dropHeader, "Forwarded", "E2b-Sandbox-Domain", HeaderTrafficToken} {
				if v := s.Header.Values(k); len(v) > 0 {
					t.Errorf("the sandbox got %s: %q; want it stripped", k, v)
				}
			}
			if r.keepHeader != "" && s.Header.Get(r.keepHeader) != tokens[r.keepHeader] {
				t.Errorf("the sandbox got %s %q; want the client's", r.keepHeader, s.Header.Get(r.keepHeader))
			}
			if xff := s.Header.Get("X-Forwarded-For"); xff != "127.0.0.1" {
				t.Errorf("X-Forwarded-For = %q; want the router's peer alone", xff)
			}
			if s.Header.Get(reqid.Header) != "req-1" || s.Header.Get("Content-Type") != "application/json" {
				t.Errorf("the sandbox got %v; want the request id and the client's other headers", s.Header)
			}
		})
	}
	for _, kind := range []string{KindEnvd, KindTraffic} {
		if n := counterReaches(t, h.metrics.requests.WithLabelValues("418", kind), 1); n != 1 {
			t.Errorf("requests_total{code=418,port_kind=%s} = %v; want 1", kind, n)
		}
	}
}

func TestRefusals(t *testing.T) {
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {}, nil)
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	traffic := map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "3000", HeaderTrafficToken: trafficToken}
	rows := []struct {
		name   string
		hdr    map[string]string
		code   int
		msg    string // the message, whole
		kind   string
		prefix bool // msg is a prefix
	}{
		{"no sandbox id", with(envd("abc"), HeaderSandboxID, ""), 400, "header E2b-Sandbox-Id is missing", KindNone, false},
		{"no port", with(envd("abc"), HeaderSandboxPort, ""), 400, "header E2b-Sandbox-Port is missing", KindNone, false},
		{"a port that is no number", with(envd("abc"), HeaderSandboxPort, "http"), 400, `header E2b-Sandbox-Port: "http" is no port (1 to 65535)`, KindNone, false},
		{"port 0", with(envd("abc"), HeaderSandboxPort, "0"), 400, `header E2b-Sandbox-Port: "0" is no port (1 to 65535)`, KindNone, false},
		{"a port too large", with(envd("abc"), HeaderSandboxPort, "65536"), 400, `header E2b-Sandbox-Port: "65536" is no port (1 to 65535)`, KindNone, false},
		{"an id that is no label value", with(envd("abc"), HeaderSandboxID, "../etc"), 400, `header E2b-Sandbox-Id: "../etc" is no sandbox id`, KindNone, false},
		{"two ids", with(envd("abc"), HeaderSandboxID, "abc, bare"), 400, "header E2b-Sandbox-Id has more than one value", KindNone, false},
		{"an unknown sandbox (E2B's answer, on every port)", envd("nope"), 502, SandboxNotFound, KindEnvd, false},
		{"a sandbox not running", envd("sleep"), 502, "sandbox sleep is not running", KindEnvd, false},
		{"a cache that fails", envd("flaky"), 502, "sandbox flaky cannot be resolved now", KindEnvd, false},
		{"no envd token", with(envd("abc"), HeaderAccessToken, ""), 401, "sandbox abc port 49983 needs its token in X-Access-Token", KindEnvd, false},
		{"a wrong envd token", with(envd("abc"), HeaderAccessToken, envdToken[1:]+"0"), 401, "wrong X-Access-Token for sandbox abc", KindEnvd, false},
		{"the traffic token for the agent", with(envd("abc"), HeaderAccessToken, "", HeaderTrafficToken, trafficToken), 401, "sandbox abc port 49983 needs its token in X-Access-Token", KindEnvd, false},
		{"the envd token as the traffic token", with(traffic, HeaderTrafficToken, envdToken), 401, "wrong E2b-Traffic-Access-Token for sandbox abc", KindTraffic, false},
		{"the envd token for an app's port", with(traffic, HeaderTrafficToken, "", HeaderAccessToken, envdToken), 401, "sandbox abc port 3000 needs its token in E2b-Traffic-Access-Token", KindTraffic, false},
		{"another sandbox's token", with(envd("bare"), HeaderAccessToken, envdToken), 401, "wrong X-Access-Token for sandbox bare", KindEnvd, false},
		{"a sandbox without E2B tokens", envd("old"), 401, "sandbox old has no E2B tokens", KindEnvd, false},
		{"a port no container declares", with(traffic, HeaderSandboxPort, "5432"), 404, "sandbox abc exposes no port 5432; its ports: 3000, 8080, 49983", KindTraffic, false},
		{"the agent's port on a sandbox without it", with(envd("bare"), HeaderAccessToken, testKey.Token(access.Envd, access.Sandbox{Principal: "bob", ID: "bare", CreatedAt: "2026-11-28T11:00:00Z"})),
			404, "sandbox bare exposes no port 49983; its ports: 8080", KindEnvd, false},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			before := counter(t, h.metrics.requests.WithLabelValues(fmt.Sprint(r.code), r.kind))
			resp, err := http.DefaultClient.Do(h.request(t, http.MethodPost, strings.NewReader("payload"), r.hdr))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("body: %v", err)
			}
			want := map[string]any{"code": float64(r.code), "message": r.msg}
			if r.msg == SandboxNotFound {
				want["sandboxId"] = r.hdr[HeaderSandboxID]
			}
			if d := cmp.Diff(want, body); resp.StatusCode != r.code || d != "" {
				t.Errorf("answer %d (-want +got):\n%s", resp.StatusCode, d)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := counterReaches(t, h.metrics.requests.WithLabelValues(fmt.Sprint(r.code), r.kind), before+1); got != before+1 {
				t.Errorf("requests_total{code=%d,port_kind=%s} went %v → %v; want one more", r.code, r.kind, before, got)
			}
		})
	}
	if n := h.hits.Load(); n != 0 {
		t.Errorf("the sandbox was reached %d times; want none", n)
	}
}

func TestStreamsResponses(t *testing.T) {
	release := make(chan struct{})
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		io.WriteString(w, "first event\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "last event\n")
	}, nil)
	defer close(release)
	// The request runs aside: a router that buffered the response would
	// not even send its header before the sandbox finished.
	req := h.request(t, http.MethodPost, strings.NewReader("{}"), envd("abc"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	line := make(chan string, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			line <- err.Error()
			return
		}
		defer resp.Body.Close()
		buf := make([]byte, len("first event\n"))
		n, _ := io.ReadFull(resp.Body, buf)
		line <- string(buf[:n])
	}()
	select {
	case got := <-line:
		if got != "first event\n" {
			t.Errorf("first chunk %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first chunk did not arrive while the sandbox was still streaming: the router buffers responses")
	}
}

// blockingBody hands out its first chunk, then waits for its release
// before the rest: a router that read the whole body before forwarding
// it would never release it.
type blockingBody struct {
	first, rest int
	release     <-chan struct{}
	sent        int
}

func (b *blockingBody) Read(p []byte) (int, error) {
	total := b.first + b.rest
	if b.sent >= total {
		return 0, io.EOF
	}
	if b.sent == b.first {
		select {
		case <-b.release:
		case <-time.After(10 * time.Second):
			return 0, fmt.Errorf("never released: the sandbox did not see the first chunk before the rest was sent")
		}
	}
	limit := total
	if b.sent < b.first {
		limit = b.first
	}
	n := min(len(p), limit-b.sent)
	for i := range n {
		p[i] = byte((b.sent + i) % 251)
	}
	b.sent += n
	return n, nil
}

func TestStreamsUploads(t *testing.T) {
	const first, size = 64 << 10, 10 << 20
	release := make(chan struct{})
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadFull(r.Body, make([]byte, first)); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		close(release)
		sum := sha256.New()
		n, err := io.Copy(sum, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%d %x", n+first, sum.Sum(nil))
	}, nil)
	body := &blockingBody{first: first, rest: size - first, release: release}
	req := h.request(t, http.MethodPost, body, envd("abc"))
	req.ContentLength = -1 // chunked, as a stream
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	// The sandbox's sum covers what came after the first chunk: the
	// client's, recomputed over the same bytes.
	rest := sha256.New()
	var all bytes.Buffer
	for i := first; i < size; i++ {
		all.WriteByte(byte(i % 251))
	}
	rest.Write(all.Bytes())
	if want := fmt.Sprintf("%d %x", size, rest.Sum(nil)); resp.StatusCode != 200 || string(got) != want {
		t.Errorf("answer %d %q; want 200 %q", resp.StatusCode, got, want)
	}
}

func TestUnreachableSandbox(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := closed.Addr().String()
	closed.Close()
	rows := []struct {
		name string
		dial func(ctx context.Context, network, addr string) (net.Conn, error)
		msg  string
	}{
		{"refused", func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, dead)
		}, "sandbox abc port 49983 is unreachable: connection refused or unreachable"},
		{"silent", func(ctx context.Context, _, _ string) (net.Conn, error) {
			<-ctx.Done()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
		}, "sandbox abc port 49983 is unreachable: no answer in time"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {}, func(o *Options) {
				o.Dial, o.DialTimeout = r.dial, 200*time.Millisecond
			})
			start := time.Now()
			resp, err := http.DefaultClient.Do(h.request(t, http.MethodGet, nil, envd("abc")))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			json.NewDecoder(resp.Body).Decode(&body)
			want := map[string]any{"code": float64(502), "message": r.msg}
			if d := cmp.Diff(want, body); resp.StatusCode != 502 || d != "" {
				t.Errorf("answer %d (-want +got):\n%s", resp.StatusCode, d)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("took %v; the dial timeout is 200ms", took)
			}
			if n := counterReaches(t, h.metrics.requests.WithLabelValues("502", KindEnvd), 1); n != 1 {
				t.Errorf("requests_total{code=502,port_kind=envd} = %v; want 1", n)
			}
		})
	}
}

// FuzzHeaders: whatever the routing headers hold, the router answers a 4xx
// (or routes, with the right token) and never panics or reaches the sandbox
// without the token.
func FuzzHeaders(f *testing.F) {
	f.Add("abc", "49983", "")
	f.Add("", "", "")
	f.Add("abc,abc", "49983,49983", envdToken)
	f.Add("abc", "-1", "x")
	f.Add("\x00", "3000", trafficToken)
	h := New(Options{Resolver: fakeResolver{"abc": abc}, Key: testKey, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dial: func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("no sandbox here") }})
	f.Fuzz(func(t *testing.T, id, port, token string) {
		req := httptest.NewRequest(http.MethodGet, "/health", nil)
		req.Header[HeaderSandboxID] = []string{id}
		req.Header[HeaderSandboxPort] = []string{port}
		req.Header[HeaderAccessToken] = []string{token}
		req.Header[HeaderTrafficToken] = []string{token}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		// A 502 means the router dialled: only with a right token.
		dialled := w.Code == http.StatusBadGateway
		if (w.Code < 400 || w.Code >= 500) && !dialled || dialled && token != envdToken && token != trafficToken {
			t.Errorf("id %q port %q token %q: %d %s; want a 4xx", id, port, token, w.Code, w.Body)
		}
	})
}

// TestUpgrades: a connection upgrade (a WebSocket to an app's port) goes
// through, both ways, and counts as the sandbox's 101.
func TestUpgrades(t *testing.T) {
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		rw.Flush()
		line, _ := rw.ReadString('\n')
		rw.WriteString("echo: " + line)
		rw.Flush()
	}, nil)
	conn, err := net.Dial("tcp", h.router.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: router\r\nConnection: Upgrade\r\nUpgrade: echo\r\n%s: abc\r\n%s: 3000\r\n%s: %s\r\n\r\n",
		HeaderSandboxID, HeaderSandboxPort, HeaderTrafficToken, trafficToken)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("answer %d; want 101", resp.StatusCode)
	}
	fmt.Fprint(conn, "hello\n")
	if line, _ := br.ReadString('\n'); line != "echo: hello\n" {
		t.Errorf("read %q after the upgrade; want the echo", line)
	}
	conn.Close()
	// The count lands when the router's handler returns, after the
	// tunnel closes.
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, h.metrics.requests.WithLabelValues("101", KindTraffic)) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("requests_total{code=101,port_kind=traffic} never reached 1")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestInitialisesAPooledAgentOnce: before the first call this replica
// forwards to an agent (a Pod it knows by UID), it gives the agent the hash
// of the token it has just checked (POST /init), once; an agent that cannot
// take it gets no call (502).
func TestInitialisesAPooledAgentOnce(t *testing.T) {
	pooled := abc
	pooled.UID = "uid-pooled"
	var mu sync.Mutex
	var seen []string
	failInit := false
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(b))
		fail := failInit
		mu.Unlock()
		if r.URL.Path == "/init" && fail {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}, func(o *Options) { o.Resolver = fakeResolver{"abc": pooled} })
	call := func() int {
		t.Helper()
		resp, err := http.DefaultClient.Do(h.request(t, http.MethodPost, strings.NewReader("{}"), envd("abc")))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	codes := []int{call(), call()}
	want := []string{
		"POST /init " + `{"accessTokenHash":"` + access.Hash(envdToken) + `"}`,
		"POST /process.Process/Start {}",
		"POST /process.Process/Start {}",
	}
	if d := cmp.Diff(want, seen); d != "" || !slices.Equal(codes, []int{204, 204}) {
		t.Errorf("the agent saw (-want +got):\n%s\nthe caller got %v, want 204 twice", d, codes)
	}

	// Another router replica (a fresh Handler) whose agent cannot take it.
	mu.Lock()
	seen, failInit = nil, true
	mu.Unlock()
	h2 := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/init" {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}, func(o *Options) { o.Resolver = fakeResolver{"abc": pooled} })
	resp, err := http.DefaultClient.Do(h2.request(t, http.MethodPost, strings.NewReader("{}"), envd("abc")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !slices.Equal(seen, []string{"POST /init"}) {
		t.Errorf("an agent that fails /init: the caller got %d, the agent saw %v; want 502 and no call", resp.StatusCode, seen)
	}
}

// lagging is a cache that shows a sandbox only from its nth lookup on (a
// watch behind the create that answered).
type lagging struct {
	mu    sync.Mutex
	calls int
	from  int
	first error
}

func (l *lagging) Resolve(id string) (Target, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.calls < l.from {
		return Target{}, fmt.Errorf("sandbox %s: %w", id, l.first)
	}
	return abc, nil
}

// TestWaitsForCachesBehindACreate: a sandbox the caches do not show yet, or
// show not running, is looked up again for CacheGrace before the request
// is refused; a cache that fails is not waited on.
func TestWaitsForCachesBehindACreate(t *testing.T) {
	for _, c := range []struct {
		name  string
		from  int
		first error
		grace time.Duration
		code  int
	}{
		{"not there yet, then there", 4, ErrNotFound, time.Second, http.StatusNoContent},
		{"not running yet, then running", 4, ErrNotRunning, time.Second, http.StatusNoContent},
		{"never there within the grace", 1 << 30, ErrNotFound, 100 * time.Millisecond, http.StatusBadGateway},
		{"no grace", 4, ErrNotFound, 0, http.StatusBadGateway},
		{"a broken cache is not waited on", 4, errors.New("the cache broke"), time.Second, http.StatusBadGateway},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := &lagging{from: c.from, first: c.first}
			h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
				func(o *Options) { o.Resolver, o.CacheGrace = l, c.grace })
			start := time.Now()
			resp, err := http.DefaultClient.Do(h.request(t, http.MethodPost, strings.NewReader("{}"), envd("abc")))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.code {
				t.Errorf("= %d after %d lookups, want %d", resp.StatusCode, l.calls, c.code)
			}
			if took := time.Since(start); took > c.grace+2*time.Second {
				t.Errorf("took %v; the grace is %v", took, c.grace)
			}
		})
	}
}

// TestDialsAgainWhenAnAttemptHearsNothing: a connection attempt that hears
// nothing (a dropped SYN) is started over at once, not left to the
// kernel's one-second resend; a refusal is not retried.
func TestDialsAgainWhenAnAttemptHearsNothing(t *testing.T) {
	for _, c := range []struct {
		name     string
		silent   int // attempts that hear nothing
		refuse   bool
		attempts int
		ok       bool
	}{
		{"the first attempt hears nothing", 1, false, 2, true},
		{"two hear nothing", 2, false, 3, true},
		{"a refusal", 0, true, 1, false},
		{"nothing ever", 1 << 30, false, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				mu.Lock()
				n++
				k := n
				mu.Unlock()
				switch {
				case c.refuse:
					return nil, errors.New("connect: connection refused")
				case k <= c.silent:
					<-ctx.Done()
					return nil, ctx.Err()
				}
				a, b := net.Pipe()
				b.Close()
				return a, nil
			}
			start := time.Now()
			conn, err := dialAgain(context.Background(), dial, "tcp", "10.0.0.1:49983", 2*time.Second)
			took := time.Since(start)
			if conn != nil {
				conn.Close()
			}
			if (err == nil) != c.ok {
				t.Fatalf("err %v, want ok %v", err, c.ok)
			}
			if c.attempts > 0 && n != c.attempts {
				t.Errorf("%d attempts, want %d", n, c.attempts)
			}
			if c.ok && took > time.Second {
				t.Errorf("took %v: longer than the kernel's own resend", took)
			}
			if !c.ok && !c.refuse && (took < 1900*time.Millisecond || took > 3*time.Second) {
				t.Errorf("a dial that never hears took %v, want the 2 s timeout", took)
			}
		})
	}
}

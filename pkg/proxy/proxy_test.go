package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/deerflow-sandbox/provisioner/pkg/egress"
)

// The callers, by the loopback source address each binds its side of the
// connection to (Linux routes all of 127.0.0.0/8 to lo).
var (
	srcExact    = netip.MustParseAddr("127.0.0.2") // example.com
	srcWildcard = netip.MustParseAddr("127.0.0.3") // *.example.com
	srcGrants   = netip.MustParseAddr("127.0.0.4") // grants only
	srcOpen     = netip.MustParseAddr("127.0.0.5") // an open-mode sandbox
	srcUnknown  = netip.MustParseAddr("127.0.0.9") // no sandbox
)

// now is the test's clock: grants end either side of it.
var now = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// publicAddr is a documentation address (TEST-NET-3) that stands in for a
// public upstream: the test's Dial sends connections to it to the local
// test servers (127.0.0.1 itself is forbidden by egress.Judge, rightly).
var (
	publicAddr  = netip.MustParseAddr("203.0.113.10")
	deadAddr    = netip.MustParseAddr("203.0.113.99") // Dial refuses it
	rawAddr     = netip.MustParseAddr("203.0.113.20") // the raw upstream
	privateAddr = netip.MustParseAddr("10.0.0.1")
)

type env struct {
	proxyAddr string
	roots     *x509.CertPool
	metrics   *Metrics
	logs      *syncBuffer
	raw       chan net.Conn // connections to the raw upstream (raw.example.com)
	plain     *httptest.Server

	mu      sync.Mutex
	dialled []string // upstream addresses the proxy dialled
	lookups []string // names the proxy resolved
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fakeResolver struct {
	e       *env
	answers map[string][]netip.Addr
}

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.e.mu.Lock()
	f.e.lookups = append(f.e.lookups, host)
	f.e.mu.Unlock()
	a, ok := f.answers[strings.TrimSuffix(host, ".")]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return a, nil
}

func newEnv(t testing.TB, opts ...func(*Server)) *env {
	t.Helper()
	// The upstreams: one plain, one TLS (httptest's certificate names
	// example.com and *.example.com). Each says what it received.
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s uri=%s hop=%q proxy-auth=%q tls=%t", r.Host, r.RequestURI,
			r.Header.Get("X-Hop"), r.Header.Get("Proxy-Authorization"), r.TLS != nil)
	})
	plain := httptest.NewServer(echo)
	t.Cleanup(plain.Close)
	secure := httptest.NewUnstartedServer(echo)
	// Refused tunnels leave it handshakes that end early: not news.
	secure.Config.ErrorLog = log.New(io.Discard, "", 0)
	secure.StartTLS()
	t.Cleanup(secure.Close)

	// A raw TCP upstream, for tests that drive both ends by hand.
	rawLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rawLn.Close() })

	e := &env{roots: x509.NewCertPool(), logs: &syncBuffer{}, raw: make(chan net.Conn, 4)}
	go func() {
		for {
			c, err := rawLn.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			e.raw <- c
		}
	}()
	e.plain = plain
	e.roots.AddCert(secure.Certificate())
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	e.metrics = m

	policies := map[netip.Addr]egress.Policy{
		srcExact:    {Mode: egress.Allowlist, Allow: []string{"example.com"}},
		srcWildcard: {Mode: egress.Allowlist, Allow: []string{"*.example.com"}, Principal: "alice"},
		srcGrants: {Mode: egress.Allowlist, Principal: "bob", Grants: []egress.Grant{
			{Name: "live.example.com", Until: ptr(now.Add(time.Minute))},
			{Name: "expired.example.com", Until: ptr(now.Add(-time.Minute))},
		}},
		srcOpen: {Mode: egress.Open, Allow: []string{"example.com"}},
	}
	pub := []netip.Addr{publicAddr}
	s := &Server{
		Lookup: func(_ context.Context, src netip.Addr) (string, egress.Policy, error) {
			p, ok := policies[src]
			if !ok {
				return "", egress.Policy{}, errors.New("no running sandbox Pod has this address")
			}
			return "sb-" + src.String(), p, nil
		},
		Resolver: fakeResolver{e: e, answers: map[string][]netip.Addr{
			"example.com":         pub,
			"api.example.com":     pub,
			"live.example.com":    pub,
			"expired.example.com": pub,
			"other.example.com":   pub,
			"private.example.com": {privateAddr},
			"mixed.example.com":   {publicAddr, netip.MustParseAddr("192.168.1.1")},
			"dead.example.com":    {deadAddr},
			"raw.example.com":     {rawAddr},
		}},
		// The seam: publicAddr:80 and :443 are the local test servers.
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			e.mu.Lock()
			e.dialled = append(e.dialled, addr)
			e.mu.Unlock()
			local := map[string]string{
				netip.AddrPortFrom(publicAddr, 80).String():  plain.Listener.Addr().String(),
				netip.AddrPortFrom(publicAddr, 443).String(): secure.Listener.Addr().String(),
				netip.AddrPortFrom(rawAddr, 80).String():     rawLn.Addr().String(),
			}[addr]
			if local == "" {
				return nil, fmt.Errorf("dial %s: connection refused (test)", addr)
			}
			return (&net.Dialer{}).DialContext(ctx, network, local)
		},
		Log:           slog.New(slog.NewJSONHandler(e.logs, nil)),
		Metrics:       m,
		Now:           func() time.Time { return now },
		HeaderTimeout: 2 * time.Second,
	}
	for _, o := range opts {
		o(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.proxyAddr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return e
}

// value reads a counter.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func ptr[T any](v T) *T { return &v }

// dialProxy opens a connection to the proxy from src.
func (e *env) dialProxy(t *testing.T, src netip.Addr) net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", e.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// client is an ordinary HTTP client whose proxy is the proxy under test,
// reached from src, trusting the TLS upstream's certificate.
func (e *env) client(src netip.Addr) *http.Client {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: e.proxyAddr}),
		DialContext:       d.DialContext,
		TLSClientConfig:   &tls.Config{RootCAs: e.roots},
		DisableKeepAlives: true,
	}}
}

// outcome is what a client saw.
type outcome struct {
	Status int
	Body   string // one line, as sent
	Err    string // a substring of the client's error
}

func get(e *env, src netip.Addr, u string) outcome {
	resp, err := e.client(src).Get(u)
	if err != nil {
		return outcome{Err: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return outcome{Status: resp.StatusCode, Body: string(b)}
}

// raw sends a request head as written and reads one response.
func raw(t *testing.T, c net.Conn, head string) outcome {
	t.Helper()
	if _, err := io.WriteString(c, head); err != nil {
		return outcome{Err: err.Error()}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return outcome{Err: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return outcome{Status: resp.StatusCode, Body: string(b)}
}

// tunnel opens a CONNECT tunnel from src; it fails the test unless the
// proxy answers 200. It reads the answer byte by byte so nothing of what
// follows is buffered away.
func (e *env) tunnel(t *testing.T, src netip.Addr, target string) net.Conn {
	t.Helper()
	c := e.dialProxy(t, src)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	var head []byte
	b := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		if _, err := c.Read(b); err != nil {
			t.Fatalf("reading the CONNECT answer: %v (so far %q)", err, head)
		}
		head = append(head, b[0])
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("CONNECT %s: %q", target, head)
	}
	return c
}

// handshake runs a TLS client in a tunnel and, when it succeeds, one GET.
func handshake(t *testing.T, c net.Conn, cfg *tls.Config) outcome {
	t.Helper()
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return outcome{Err: err.Error()}
	}
	return raw(t, tc, "GET /in-tunnel HTTP/1.1\r\nHost: "+cfg.ServerName+"\r\nConnection: close\r\n\r\n")
}

func TestProxy(t *testing.T) {
	e := newEnv(t)
	type check struct {
		allowed bool
		reason  string
	}
	rows := []struct {
		name string
		do   func(t *testing.T) outcome
		want outcome
		// wantBody is compared as a substring when want.Body is empty.
		wantBody string
		count    check
		dialled  []string // upstream addresses dialled, when given
	}{{
		name: "allowed HTTP",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "GET http://example.com/p?q=1 HTTP/1.1\r\nHost: example.com\r\n"+
				"Proxy-Authorization: Basic c2VjcmV0\r\nConnection: X-Hop\r\nX-Hop: 1\r\n\r\n")
		},
		want:    outcome{Status: 200, Body: `host=example.com uri=/p?q=1 hop="" proxy-auth="" tls=false`},
		count:   check{true, ReasonOK},
		dialled: []string{"203.0.113.10:80"},
	}, {
		name:    "allowed HTTP through net/http's client",
		do:      func(t *testing.T) outcome { return get(e, srcExact, "http://example.com/x") },
		want:    outcome{Status: 200, Body: `host=example.com uri=/x hop="" proxy-auth="" tls=false`},
		count:   check{true, ReasonOK},
		dialled: []string{"203.0.113.10:80"},
	}, {
		// The client verifies the upstream's own certificate: the tunnel
		// is end to end, nothing intercepted.
		name:    "allowed HTTPS via CONNECT",
		do:      func(t *testing.T) outcome { return get(e, srcExact, "https://example.com/s") },
		want:    outcome{Status: 200, Body: `host=example.com uri=/s hop="" proxy-auth="" tls=true`},
		count:   check{true, ReasonOK},
		dialled: []string{"203.0.113.10:443"},
	}, {
		name: "allowed plain HTTP inside CONNECT",
		do: func(t *testing.T) outcome {
			return raw(t, e.tunnel(t, srcExact, "example.com:80"), "GET /t HTTP/1.1\r\nHost: example.com\r\n\r\n")
		},
		want:  outcome{Status: 200, Body: `host=example.com uri=/t hop="" proxy-auth="" tls=false`},
		count: check{true, ReasonOK},
	}, {
		name: "unlisted name",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "CONNECT other.example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403, Body: "egress proxy: refused: other.example.com is not on this sandbox's egress list; add it to the template's list or grant it\n"},
		count:    check{false, ReasonNotListed},
		dialled:  []string{},
		wantBody: "",
	}, {
		name:  "wildcard matches a name below it",
		do:    func(t *testing.T) outcome { return get(e, srcWildcard, "https://api.example.com/w") },
		want:  outcome{Status: 200, Body: `host=api.example.com uri=/w hop="" proxy-auth="" tls=true`},
		count: check{true, ReasonOK},
	}, {
		name: "wildcard does not match its base name",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcWildcard), "CONNECT example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403},
		wantBody: "example.com is not on this sandbox's egress list",
		count:    check{false, ReasonNotListed},
	}, {
		name: "IP literal",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "CONNECT 203.0.113.10:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403},
		wantBody: "203.0.113.10 is an IP address",
		count:    check{false, ReasonIPLiteral},
	}, {
		name: "IPv6 literal on plain HTTP",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "GET http://[2001:db8::1]/ HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n")
		},
		want:     outcome{Status: 403},
		wantBody: "is an IP address",
		count:    check{false, ReasonIPLiteral},
	}, {
		name: "private answer",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcWildcard), "CONNECT private.example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403, Body: "egress proxy: refused: the name resolves to 10.0.0.1 (a private address); every answer must be public\n"},
		count:    check{false, ReasonForbiddenAddress},
		dialled:  []string{},
		wantBody: "",
	}, {
		name:     "mixed answer",
		do:       func(t *testing.T) outcome { return get(e, srcWildcard, "http://mixed.example.com/") },
		want:     outcome{Status: 403},
		wantBody: "the name resolves to 192.168.1.1 (a private address); every answer must be public",
		count:    check{false, ReasonForbiddenAddress},
		dialled:  []string{},
	}, {
		name: "unknown caller",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcUnknown), "CONNECT example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403, Body: "egress proxy: refused: the source address 127.0.0.9 is no sandbox's: no running sandbox Pod has this address\n"},
		count:    check{false, ReasonUnknownCaller},
		dialled:  []string{},
		wantBody: "",
	}, {
		name: "open-mode sandbox",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcOpen), "CONNECT example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403},
		wantBody: `egress mode is "open"`,
		count:    check{false, ReasonNotListed},
	}, {
		name: "disallowed port",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "CONNECT example.com:22 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403, Body: "egress proxy: refused: port 22 is not allowed; the proxy reaches ports 80, 443 only\n"},
		count:    check{false, ReasonPort},
		wantBody: "",
	}, {
		// A certificate valid for the SNI name (httptest's names
		// *.example.com): only the proxy's check stops it.
		name: "SNI mismatch",
		do: func(t *testing.T) outcome {
			return handshake(t, e.tunnel(t, srcWildcard, "api.example.com:443"), &tls.Config{ServerName: "other.example.com", RootCAs: e.roots})
		},
		want:  outcome{Err: "remote error: tls: access denied"},
		count: check{false, ReasonSNI},
	}, {
		name: "no SNI",
		do: func(t *testing.T) outcome {
			return handshake(t, e.tunnel(t, srcExact, "example.com:443"), &tls.Config{InsecureSkipVerify: true})
		},
		want:  outcome{Err: "remote error: tls: access denied"},
		count: check{false, ReasonSNI},
	}, {
		name: "SNI matches in another case",
		do: func(t *testing.T) outcome {
			return handshake(t, e.tunnel(t, srcExact, "example.com:443"), &tls.Config{ServerName: "EXAMPLE.com", RootCAs: e.roots})
		},
		want:  outcome{Status: 200, Body: `host=EXAMPLE.com uri=/in-tunnel hop="" proxy-auth="" tls=true`},
		count: check{true, ReasonOK},
	}, {
		name: "Encrypted ClientHello",
		do: func(t *testing.T) outcome {
			return handshake(t, e.tunnel(t, srcExact, "example.com:443"), &tls.Config{
				ServerName: "example.com", RootCAs: e.roots, MinVersion: tls.VersionTLS13,
				EncryptedClientHelloConfigList: echConfigList(t, "example.com"),
			})
		},
		want:  outcome{Err: "remote error: tls: access denied"},
		count: check{false, ReasonECH},
	}, {
		name: "Host mismatch inside CONNECT",
		do: func(t *testing.T) outcome {
			return raw(t, e.tunnel(t, srcExact, "example.com:80"), "GET / HTTP/1.1\r\nHost: other.example.com\r\n\r\n")
		},
		want:  outcome{Status: 403, Body: "egress proxy: refused: the request's Host \"other.example.com\" is not example.com, the host this tunnel was opened to; they must agree\n"},
		count: check{false, ReasonHostMismatch},
	}, {
		name: "neither TLS nor HTTP inside CONNECT",
		do: func(t *testing.T) outcome {
			c := e.tunnel(t, srcExact, "example.com:443")
			io.WriteString(c, "SSH-2.0-OpenSSH_9.6\r\n\r\n")
			b, err := io.ReadAll(c)
			return outcome{Body: string(b), Err: fmt.Sprint(err)}
		},
		want:     outcome{Err: "<nil>"},
		wantBody: "HTTP/1.1 403 Forbidden\r\n",
		count:    check{false, ReasonBadRequest},
	}, {
		name: "Host mismatch on plain HTTP",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "GET http://example.com/ HTTP/1.1\r\nHost: other.example.com\r\n\r\n")
		},
		want:     outcome{Status: 403, Body: "egress proxy: refused: the Host header \"other.example.com\" is not the URL's host example.com; they must agree\n"},
		count:    check{false, ReasonHostMismatch},
		dialled:  []string{},
		wantBody: "",
	}, {
		name: "origin-form request",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcExact), "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")
		},
		want:     outcome{Status: 400},
		wantBody: "absolute form",
		count:    check{false, ReasonBadRequest},
	}, {
		name:  "grant live",
		do:    func(t *testing.T) outcome { return get(e, srcGrants, "https://live.example.com/g") },
		want:  outcome{Status: 200, Body: `host=live.example.com uri=/g hop="" proxy-auth="" tls=true`},
		count: check{true, ReasonOK},
	}, {
		name: "grant expired",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcGrants), "CONNECT expired.example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 403},
		wantBody: "expired.example.com is not on this sandbox's egress list",
		count:    check{false, ReasonNotListed},
	}, {
		name: "name that does not resolve",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcWildcard), "CONNECT nx.example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 502},
		wantBody: "egress proxy: failed: the name nx.example.com did not resolve",
		count:    check{false, ReasonResolve},
	}, {
		name: "upstream unreachable",
		do: func(t *testing.T) outcome {
			return raw(t, e.dialProxy(t, srcWildcard), "CONNECT dead.example.com:443 HTTP/1.1\r\n\r\n")
		},
		want:     outcome{Status: 502},
		wantBody: "could not connect to dead.example.com port 443",
		count:    check{false, ReasonUpstream},
		dialled:  []string{"203.0.113.99:443"},
	}}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			counter := e.metrics.requests.WithLabelValues(map[bool]string{true: "allowed", false: "refused"}[r.count.allowed], r.count.reason)
			before := value(t, counter)
			e.mu.Lock()
			e.dialled = nil
			e.mu.Unlock()

			got := r.do(t)
			if r.wantBody != "" {
				if !strings.Contains(got.Body, r.wantBody) {
					t.Errorf("body %q does not contain %q", got.Body, r.wantBody)
				}
				got.Body = ""
			}
			if r.want.Err != "" {
				if !strings.Contains(got.Err, r.want.Err) {
					t.Errorf("client error %q does not contain %q", got.Err, r.want.Err)
				}
				got.Err = r.want.Err
			}
			if diff := cmp.Diff(r.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			// The count is made before the client sees the answer.
			if d := value(t, counter) - before; d != 1 {
				t.Errorf("requests_total{%v} grew by %v, want 1", r.count, d)
			}
			if r.dialled != nil {
				e.mu.Lock()
				dialled := append([]string{}, e.dialled...)
				e.mu.Unlock()
				if diff := cmp.Diff(r.dialled, dialled); diff != "" {
					t.Errorf("dialled (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// The log line of a refusal names the sandbox, the source, the target and
// the reason; an allowed connection's names the sandbox and the upstream.
func TestProxyLogs(t *testing.T) {
	e := newEnv(t)
	raw(t, e.dialProxy(t, srcExact), "CONNECT other.example.com:443 HTTP/1.1\r\n\r\n")
	get(e, srcExact, "http://example.com/")
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		delete(m, "time")
		lines = append(lines, m)
	}
	want := []map[string]any{{
		"level": "WARN", "msg": "egress refused", "sandbox": "sb-127.0.0.2", "source": "127.0.0.2",
		"method": "CONNECT", "host": "other.example.com", "port": float64(443), "verdict": "refused",
		"reason": "not_listed", "status": float64(403),
		"detail": "other.example.com is not on this sandbox's egress list; add it to the template's list or grant it",
	}, {
		"level": "INFO", "msg": "egress allowed", "sandbox": "sb-127.0.0.2", "source": "127.0.0.2",
		"method": "GET", "host": "example.com", "port": float64(80), "verdict": "allowed", "reason": "ok",
		"upstream": "203.0.113.10:80",
	}}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
}

// The proxy resolves each name once per request and asks for the rooted
// name (no search domains).
func TestProxyResolvesOnceRooted(t *testing.T) {
	e := newEnv(t)
	if got := get(e, srcExact, "https://example.com/"); got.Status != 200 {
		t.Fatalf("GET: %+v", got)
	}
	if diff := cmp.Diff([]string{"example.com."}, e.lookups); diff != "" {
		t.Errorf("lookups (-want +got):\n%s", diff)
	}
}

// A tunnel nobody uses is closed after IdleTimeout.
func TestProxyIdleTunnel(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.IdleTimeout = 200 * time.Millisecond })
	c := e.tunnel(t, srcWildcard, "raw.example.com:80")
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: raw.example.com\r\n\r\n")
	<-e.raw
	start := time.Now()
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("reading the tunnel: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the idle tunnel closed after %v, want about 200ms", d)
	}
}

// A tunnel whose client sends nothing after the 200 is closed after
// HeaderTimeout, and counted.
func TestProxySilentTunnel(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.HeaderTimeout = 100 * time.Millisecond })
	counter := e.metrics.requests.WithLabelValues("refused", ReasonBadRequest)
	c := e.tunnel(t, srcExact, "example.com:443")
	b, err := io.ReadAll(c)
	if err != nil || len(b) != 0 {
		t.Errorf("the silent tunnel ended with %q, %v; want a bare close", b, err)
	}
	if got := value(t, counter); got != 1 {
		t.Errorf("requests_total{refused,bad_request} = %v, want 1", got)
	}
}

// Each half of a tunnel closes on its own: the client's end of stream
// reaches the upstream, which can still answer.
func TestProxyHalfClose(t *testing.T) {
	e := newEnv(t)
	c := e.tunnel(t, srcWildcard, "raw.example.com:80")
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: raw.example.com\r\n\r\nrest")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	up := <-e.raw
	up.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(up) // ends only when the client's EOF arrives
	if err != nil {
		t.Fatalf("upstream read: %v", err)
	}
	if want := "GET / HTTP/1.1\r\nHost: raw.example.com\r\n\r\nrest"; string(got) != want {
		t.Errorf("upstream got %q, want %q", got, want)
	}
	io.WriteString(up, "answer after EOF")
	up.Close()
	back, err := io.ReadAll(c)
	if err != nil || string(back) != "answer after EOF" {
		t.Errorf("client got %q, %v; want the upstream's answer", back, err)
	}
}

// A plain HTTP response is streamed: the client has the first part before
// the upstream writes the rest.
func TestProxyStreamsPlainHTTP(t *testing.T) {
	e := newEnv(t)
	c := e.dialProxy(t, srcWildcard)
	io.WriteString(c, "GET http://raw.example.com/stream HTTP/1.1\r\nHost: raw.example.com\r\n\r\n")
	up := <-e.raw
	up.SetDeadline(time.Now().Add(5 * time.Second))
	ureq, err := http.ReadRequest(bufio.NewReader(up))
	if err != nil {
		t.Fatal(err)
	}
	if ureq.RequestURI != "/stream" || ureq.Host != "raw.example.com" {
		t.Errorf("upstream got %s %s Host %s; want /stream, raw.example.com", ureq.Method, ureq.RequestURI, ureq.Host)
	}
	io.WriteString(up, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first" {
		t.Fatalf("first part: %q, %v", first, err)
	}
	io.WriteString(up, "4\r\nlast\r\n0\r\n\r\n")
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "last" {
		t.Errorf("rest: %q, %v", rest, err)
	}
}

// A request body goes up as the client sends it, after the upstream's
// 100 Continue has come down to a client that waits for it.
func TestProxyForwardsBodyAfterContinue(t *testing.T) {
	e := newEnv(t)
	c := e.dialProxy(t, srcWildcard)
	io.WriteString(c, "POST http://raw.example.com/up HTTP/1.1\r\nHost: raw.example.com\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	up := <-e.raw
	up.SetDeadline(time.Now().Add(5 * time.Second))
	ubr := bufio.NewReader(up)
	ureq, err := http.ReadRequest(ubr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(up, "HTTP/1.1 100 Continue\r\n\r\n")

	cbr := bufio.NewReader(c)
	cont, err := http.ReadResponse(cbr, nil)
	if err != nil || cont.StatusCode != 100 {
		t.Fatalf("want 100 Continue first, got %v, %v", cont, err)
	}
	io.WriteString(c, "hello")
	body, err := io.ReadAll(ureq.Body)
	if err != nil || string(body) != "hello" {
		t.Fatalf("upstream body %q, %v", body, err)
	}
	io.WriteString(up, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
	resp, err := http.ReadResponse(cbr, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 || string(got) != "ok" {
		t.Errorf("got %d %q, want 201 \"ok\"", resp.StatusCode, got)
	}
}

// Time to connect upstream is observed for each allowed connection.
func TestProxyConnectHistogram(t *testing.T) {
	e := newEnv(t)
	for range 3 {
		get(e, srcExact, "https://example.com/")
	}
	var m dto.Metric
	if err := e.metrics.connect.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got != 3 {
		t.Errorf("upstream_connect_seconds count = %d, want 3", got)
	}
}

// echConfigList builds a valid ECHConfigList (draft-ietf-tls-esni-22,
// section 4) of one X25519 config, so the Go client sends an Encrypted
// ClientHello whose outer server name is publicName.
func echConfigList(t *testing.T, publicName string) []byte {
	t.Helper()
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u16 := func(b []byte, v int) []byte { return binary.BigEndian.AppendUint16(b, uint16(v)) }
	var contents []byte
	contents = append(contents, 7)   // config_id
	contents = u16(contents, 0x0020) // kem: DHKEM(X25519, HKDF-SHA256)
	pub := key.PublicKey().Bytes()
	contents = u16(contents, len(pub))
	contents = append(contents, pub...)
	contents = u16(contents, 4)      // cipher_suites length
	contents = u16(contents, 0x0001) // kdf: HKDF-SHA256
	contents = u16(contents, 0x0001) // aead: AES-128-GCM
	contents = append(contents, 0)   // maximum_name_length
	contents = append(contents, byte(len(publicName)))
	contents = append(contents, publicName...)
	contents = u16(contents, 0) // extensions

	config := u16(nil, 0xfe0d) // version
	config = u16(config, len(contents))
	config = append(config, contents...)
	return append(u16(nil, len(config)), config...)
}

// TestProxyBoundsEachPrincipal: with MaxPerPrincipal 1, alice's sandbox
// holding one tunnel has her next CONNECT refused (429, counted as
// too_many), bob's sandbox still gets his, and once hers is closed she
// gets one again.
func TestProxyBoundsEachPrincipal(t *testing.T) {
	e := newEnv(t, func(s *Server) { s.MaxPerPrincipal = 1 })
	counter := e.metrics.requests.WithLabelValues("refused", ReasonTooMany)
	first := e.tunnel(t, srcWildcard, "raw.example.com:80")
	c := e.dialProxy(t, srcWildcard)
	got := raw(t, c, "CONNECT raw.example.com:80 HTTP/1.1\r\nHost: raw.example.com:80\r\n\r\n")
	if got.Status != http.StatusTooManyRequests || !strings.Contains(got.Body, "connections open") {
		t.Errorf("alice's second tunnel = %+v; want 429 saying why", got)
	}
	if n := value(t, counter); n != 1 {
		t.Errorf("too_many refusals counted %v; want 1", n)
	}
	e.tunnel(t, srcGrants, "live.example.com:80").Close()
	first.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c := e.dialProxy(t, srcWildcard)
		fmt.Fprintf(c, "CONNECT raw.example.com:80 HTTP/1.1\r\nHost: raw.example.com:80\r\n\r\n")
		b := make([]byte, 12)
		_, err := io.ReadFull(c, b)
		c.Close()
		if err == nil && string(b) == "HTTP/1.1 200" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("alice's tunnel after hers closed: %q %v; want 200", b, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The surroundings of these tests: the stand-in's own API over HTTP and
// TLS (the public host), and a fake egress proxy in front of them that
// answers by the name asked for (fakeProxy).
var (
	backendHTTP  *httptest.Server
	backendTLS   *httptest.Server
	backendCert  string // the TLS backend's certificate fingerprint
	proxy        *fakeProxy
	helloMu      sync.Mutex
	helloSeen    []*tls.ClientHelloInfo // by the TLS backend, in order
	proxyEnvVars = []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"}
)

// TestMain sets the proxy environment before anything reads it:
// http.ProxyFromEnvironment (the http action's) reads it once a process.
func TestMain(m *testing.M) {
	cert, err := selfSigned([]string{"allowed.test"}, "127.0.0.1")
	if err != nil {
		log.Fatal(err)
	}
	backendCert = certFingerprint(cert.Certificate[0])
	mux := newMux(&cert)
	backendHTTP = httptest.NewServer(mux)
	backendTLS = httptest.NewUnstartedServer(mux)
	backendTLS.TLS = &tls.Config{
		Certificates: []tls.Certificate{cert},
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			helloMu.Lock()
			defer helloMu.Unlock()
			helloSeen = append(helloSeen, h)
			return nil, nil
		},
	}
	backendTLS.Config.ErrorLog = log.New(io.Discard, "", 0) // the verified request is refused on purpose
	backendTLS.StartTLS()
	proxy, err = startFakeProxy(backendHTTP.Listener.Addr().String(), backendTLS.Listener.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	for _, k := range proxyEnvVars {
		os.Unsetenv(k)
	}
	os.Setenv("HTTP_PROXY", "http://"+proxy.addr)
	os.Setenv("HTTPS_PROXY", "http://"+proxy.addr)
	code := m.Run()
	proxy.ln.Close()
	backendHTTP.Close()
	backendTLS.Close()
	os.Exit(code)
}

// lastHello is the last ClientHello the TLS backend saw.
func lastHello(t *testing.T) *tls.ClientHelloInfo {
	t.Helper()
	helloMu.Lock()
	defer helloMu.Unlock()
	if len(helloSeen) == 0 {
		t.Fatal("the TLS backend saw no ClientHello")
	}
	return helloSeen[len(helloSeen)-1]
}

// fakeProxy plays the egress proxy: CONNECT and absolute-form requests,
// decided by the host asked for:
//
//	refused.test   403 with a one-line reason (CONNECT or plain HTTP)
//	alert.test     CONNECT's 200, then a TLS alert access_denied
//	inner403.test  CONNECT's 200, then an HTTP 403 inside the tunnel
//	anything else  through to the backend: port 443 to the TLS one, else
//	               the plain one
type fakeProxy struct {
	ln        net.Listener
	addr      string
	plain     string // backend addresses
	tls       string
	mu        sync.Mutex
	requested []string // "CONNECT host:port" or "GET <absolute URL> Host: <host>"
}

const refusal = "not on the allowlist"

func startFakeProxy(plain, tlsAddr string) (*fakeProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake proxy: %w", err)
	}
	p := &fakeProxy{ln: ln, addr: ln.Addr().String(), plain: plain, tls: tlsAddr}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p, nil
}

// last is the last request the proxy got.
func (p *fakeProxy) last() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.requested) == 0 {
		return ""
	}
	return p.requested[len(p.requested)-1]
}

func (p *fakeProxy) serve(c net.Conn) {
	defer c.Close()
	// Go's ReadRequest takes an absolute-form request's Host from its
	// URL: the Host header as sent is read from a copy of the bytes.
	var raw bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &raw))
	for {
		raw.Reset()
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		host := req.URL.Hostname()
		seen := req.Method + " " + req.URL.String() + " Host: " + rawHost(raw.String())
		if req.Method == http.MethodConnect {
			seen = "CONNECT " + req.Host
			host, _, _ = net.SplitHostPort(req.Host)
		}
		p.mu.Lock()
		p.requested = append(p.requested, seen)
		p.mu.Unlock()
		if host == "refused.test" {
			reason := host + ": " + refusal + "\n"
			fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(reason), reason)
			continue
		}
		if req.Method != http.MethodConnect {
			// Absolute-form: forward to the plain backend, Host as asked.
			req.RequestURI = ""
			req.URL.Host = p.plain
			resp, err := (&http.Transport{}).RoundTrip(req)
			if err != nil {
				fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
				return
			}
			_ = resp.Write(c)
			resp.Body.Close()
			continue
		}
		fmt.Fprint(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		switch host {
		case "alert.test":
			_, _ = br.Read(make([]byte, 1024))                    // the ClientHello
			_, _ = c.Write([]byte{0x15, 0x03, 0x03, 0, 2, 2, 49}) // alert, TLS 1.2, fatal access_denied
			return
		case "inner403.test":
			_, _ = br.Read(make([]byte, 1024))
			reason := "SNI inner403.test: " + refusal + "\n"
			fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(reason), reason)
			return
		}
		_, port, _ := net.SplitHostPort(req.Host)
		to := p.plain
		if port == "443" {
			to = p.tls
		}
		b, err := net.Dial("tcp", to)
		if err != nil {
			return
		}
		go func() { _, _ = io.Copy(b, br); b.Close() }()
		_, _ = io.Copy(c, b)
		return
	}
}

// rawHost is the Host header in a request's bytes.
func rawHost(req string) string {
	head, _, _ := strings.Cut(req, "\r\n\r\n")
	for _, l := range strings.Split(head, "\r\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "Host") {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestTunnel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		a         action
		wantProxy string   // the request the proxy saw
		want      []string // in the output
		wantErr   []string // in the error
		wantHello string   // the outer SNI the TLS backend saw
		wantECH   bool     // and whether the hello carried ECH
	}{
		{
			name: "plain GET, Host from addr", a: action{Addr: "allowed.test:80"},
			wantProxy: "CONNECT allowed.test:80", want: []string{"200 ", `"status":"ok"`, `"host_header":"allowed.test"`},
		},
		{
			name: "plain GET, Host given", a: action{Addr: "allowed.test:80", Host: "other.test"},
			wantProxy: "CONNECT allowed.test:80", want: []string{"200 ", `"host_header":"other.test"`},
		},
		{
			name: "TLS", a: action{Addr: "allowed.test:443", SNI: "allowed.test"},
			wantProxy: "CONNECT allowed.test:443", want: []string{"200 ", `"host_header":"allowed.test"`, `"sni":"allowed.test"`, "\ncert=" + backendCert},
			wantHello: "allowed.test",
		},
		{
			name: "TLS, Host differs from SNI", a: action{Addr: "allowed.test:443", SNI: "allowed.test", Host: "unlisted.test"},
			wantProxy: "CONNECT allowed.test:443", want: []string{"200 ", `"host_header":"unlisted.test"`, `"sni":"allowed.test"`},
			wantHello: "allowed.test",
		},
		{
			name: "TLS, SNI differs from CONNECT", a: action{Addr: "allowed.test:443", SNI: "unlisted.test"},
			wantProxy: "CONNECT allowed.test:443", want: []string{"200 ", `"sni":"unlisted.test"`},
			wantHello: "unlisted.test",
		},
		{
			// The backend holds no ECH key: past a proxy that lets it
			// through, ECH is rejected.
			name: "ECH", a: action{Addr: "allowed.test:443", SNI: "allowed.test", ECH: true},
			wantProxy: "CONNECT allowed.test:443", wantErr: []string{"tls: server rejected ECH"},
			wantHello: "allowed.test", wantECH: true,
		},
		{
			name: "ECH, public name from addr", a: action{Addr: "allowed.test:443", ECH: true},
			wantProxy: "CONNECT allowed.test:443", wantErr: []string{"tls: server rejected ECH"},
			wantHello: "allowed.test", wantECH: true,
		},
		{
			name: "CONNECT refused", a: action{Addr: "refused.test:443", SNI: "refused.test"},
			wantProxy: "CONNECT refused.test:443", wantErr: []string{"403 Forbidden", "refused.test: " + refusal},
		},
		{
			name: "TLS alert in the tunnel", a: action{Addr: "alert.test:443", SNI: "alert.test"},
			wantProxy: "CONNECT alert.test:443", wantErr: []string{"remote error: tls: access denied"},
		},
		{
			name: "HTTP 403 in the tunnel", a: action{Addr: "inner403.test:443", SNI: "inner403.test"},
			wantProxy: "CONNECT inner403.test:443", wantErr: []string{"first record does not look like a TLS handshake", "403 Forbidden", "SNI inner403.test: " + refusal},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.a.Op, tc.a.TimeoutMs = "tunnel", 5000
			r := run(context.Background(), tc.a)
			if got := proxy.last(); got != tc.wantProxy {
				t.Errorf("the proxy's last request %q, want %q", got, tc.wantProxy)
			}
			if tc.wantErr != nil {
				if r.OK {
					t.Fatalf("ok (%q); want an error with %q", r.Output, tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(r.Error, w) {
						t.Errorf("error %q lacks %q", r.Error, w)
					}
				}
			} else {
				if !r.OK {
					t.Fatalf("error %q", r.Error)
				}
				for _, w := range tc.want {
					if !strings.Contains(r.Output, w) {
						t.Errorf("output %q lacks %q", r.Output, w)
					}
				}
			}
			if tc.wantHello != "" {
				h := lastHello(t)
				if h.ServerName != tc.wantHello || slices.Contains(h.Extensions, echVersion) != tc.wantECH {
					t.Errorf("the TLS backend saw SNI %q with ECH %v; want %q, %v", h.ServerName, slices.Contains(h.Extensions, echVersion), tc.wantHello, tc.wantECH)
				}
			}
		})
	}
}

func TestTunnelWithoutProxy(t *testing.T) {
	for _, k := range []string{"HTTPS_PROXY", "https_proxy"} {
		t.Setenv(k, "")
	}
	r := run(context.Background(), action{Op: "tunnel", Addr: "allowed.test:443"})
	if r.OK || !strings.Contains(r.Error, "HTTPS_PROXY is not set") {
		t.Errorf("without HTTPS_PROXY: %+v; want an error that says so", r)
	}
}

func TestEnvProxy(t *testing.T) {
	for _, tc := range []struct {
		upper, lower, want, wantErr string
	}{
		{upper: "http://10.96.0.20:3128", want: "10.96.0.20:3128"},
		{lower: "http://10.96.0.20:3128", want: "10.96.0.20:3128"},
		{upper: "http://10.96.0.20:3128", lower: "http://10.96.0.21:3128", want: "10.96.0.20:3128"},
		{upper: "10.96.0.20:3128", want: "10.96.0.20:3128"},
		{upper: "http://proxy.test", want: "proxy.test:80"},
		{upper: "https://10.96.0.20:3128", wantErr: "only an http:// proxy"},
	} {
		t.Setenv("HTTPS_PROXY", tc.upper)
		t.Setenv("https_proxy", tc.lower)
		got, err := envProxy()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("envProxy() with %q/%q = %q, %v; want an error with %q", tc.upper, tc.lower, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("envProxy() with %q/%q = %q, %v; want %q", tc.upper, tc.lower, got, err, tc.want)
		}
	}
}

// TestHTTPThroughProxy is the http action through the environment's
// proxy; the error strings are those an e2e test sees from Go's client.
func TestHTTPThroughProxy(t *testing.T) {
	for _, tc := range []struct {
		name      string
		a         action
		wantProxy string
		want      []string
		wantErr   []string
	}{
		{
			name: "plain", a: action{URL: "http://allowed.test/v1/sandbox"},
			wantProxy: "GET http://allowed.test/v1/sandbox Host: allowed.test", want: []string{"200 ", `"host_header":"allowed.test"`},
		},
		{
			// The proxy gets the two names; this one, as a Go server,
			// takes the request line's (RFC 9112 3.2.2) and forwards that.
			name: "plain, Host differs from URL", a: action{URL: "http://allowed.test/v1/sandbox", Host: "unlisted.test"},
			wantProxy: "GET http://allowed.test/v1/sandbox Host: unlisted.test", want: []string{"200 ", `"host_header":"allowed.test"`},
		},
		{
			name: "plain, refused", a: action{URL: "http://refused.test/v1/sandbox"},
			wantProxy: "GET http://refused.test/v1/sandbox Host: refused.test", want: []string{"403 refused.test: " + refusal},
		},
		{
			name: "TLS", a: action{URL: "https://allowed.test/v1/sandbox", Insecure: true},
			wantProxy: "CONNECT allowed.test:443", want: []string{"200 ", `"sni":"allowed.test"`, "\ncert=" + backendCert},
		},
		{
			name: "TLS, the certificate", a: action{URL: "https://allowed.test/v1/cert", Insecure: true},
			wantProxy: "CONNECT allowed.test:443", want: []string{"200 " + backendCert + "\ncert=" + backendCert},
		},
		{
			name: "TLS, Host differs from SNI", a: action{URL: "https://allowed.test/v1/sandbox", Insecure: true, Host: "unlisted.test"},
			wantProxy: "CONNECT allowed.test:443", want: []string{`"host_header":"unlisted.test"`, `"sni":"allowed.test"`},
		},
		{
			name: "TLS, verified", a: action{URL: "https://allowed.test/v1/sandbox"},
			wantProxy: "CONNECT allowed.test:443", wantErr: []string{"certificate signed by unknown authority"},
		},
		{
			// Go's client drops the body of a refused CONNECT.
			name: "CONNECT refused", a: action{URL: "https://refused.test/v1/sandbox", Insecure: true},
			wantProxy: "CONNECT refused.test:443", wantErr: []string{`Get "https://refused.test/v1/sandbox": Forbidden`},
		},
		{
			name: "TLS alert in the tunnel", a: action{URL: "https://alert.test/v1/sandbox", Insecure: true},
			wantProxy: "CONNECT alert.test:443", wantErr: []string{"remote error: tls: access denied"},
		},
		{
			name: "HTTP 403 in the tunnel", a: action{URL: "https://inner403.test/v1/sandbox", Insecure: true},
			wantProxy: "CONNECT inner403.test:443", wantErr: []string{"http: server gave HTTP response to HTTPS client"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.a.Op, tc.a.TimeoutMs = "http", 5000
			r := run(context.Background(), tc.a)
			if got := proxy.last(); got != tc.wantProxy {
				t.Errorf("the proxy's last request %q, want %q", got, tc.wantProxy)
			}
			if tc.wantErr != nil {
				if r.OK {
					t.Fatalf("ok (%q); want an error with %q", r.Output, tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(r.Error, w) {
						t.Errorf("error %q lacks %q", r.Error, w)
					}
				}
				return
			}
			if !r.OK {
				t.Fatalf("error %q", r.Error)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Output, w) {
					t.Errorf("output %q lacks %q", r.Output, w)
				}
			}
		})
	}
}

// TestCertEndpointWithoutTLS: a stand-in without TLS says so.
func TestCertEndpointWithoutTLS(t *testing.T) {
	srv := httptest.NewServer(newMux(nil))
	defer srv.Close()
	resp, err := (&http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}).Get(srv.URL + "/v1/cert")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /v1/cert without TLS: %s, want 404", resp.Status)
	}
}

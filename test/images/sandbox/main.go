// Command sandbox stands in for DeerFlow's sandbox image on the real test
// node. It answers what DeerFlow's client and our readiness probe use
// (GET /v1/sandbox) and, for the attack tests, POST /v1/exec: a fixed set of
// actions that hostile code inside a sandbox would try (connect anywhere,
// query any DNS server, talk to the egress proxy by hand, plant symlinks,
// read files, call into the kernel). It is a test image: it exists to
// behave like an attacker, and is never deployed.
//
// The real node's surroundings run it too, as hosts outside the cluster:
// SANDBOX_DNS_ADDR adds a toy DNS server (zone.go; SANDBOX_DNS_ZONE names
// what it answers besides its one fallback address), SANDBOX_TLS_ADDR the
// same API over TLS with a certificate made at start for SANDBOX_TLS_NAMES
// (tls.go; GET /v1/cert tells its fingerprint).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// action is one request to /v1/exec.
type action struct {
	Op   string `json:"op"`
	Addr string `json:"addr,omitempty"` // connect: host:port
	URL  string `json:"url,omitempty"`  // http
	// http: a POST (or other method) with these headers and body, as a
	// client in the cluster would send a CloudEvent; GET without them.
	Method  string            `json:"method,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    string            `json:"body,omitempty"`
	Server  string            `json:"server,omitempty"` // dns: ip:port
	Name    string            `json:"name,omitempty"`   // dns; kernel: the probe (kernel.go)
	Path    string            `json:"path,omitempty"`   // read, list, symlink (the link)
	Target  string            `json:"target,omitempty"` // symlink
	// timing (timing.go): how many requests, how many at a time.
	N           int `json:"n,omitempty"`
	Concurrency int `json:"concurrency,omitempty"`
	TimeoutMs   int `json:"timeout_ms,omitempty"`
	// http: the Host header, when it should differ from the URL's host
	// (a request that names one host to the proxy and another to the
	// server); tunnel: the Host of the GET sent through the tunnel.
	Host string `json:"host,omitempty"`
	// http: skip the verification of the server's certificate (the
	// surroundings' certificates are self-signed).
	Insecure bool `json:"insecure,omitempty"`
	// tunnel (tunnel.go): the TLS handshake's SNI through the tunnel;
	// empty (and no ECH) sends the GET in the clear.
	SNI string `json:"sni,omitempty"`
	// tunnel: the handshake carries an Encrypted Client Hello, whose
	// public (outer) name is SNI (default: Addr's host).
	ECH bool `json:"ech,omitempty"`
}

// result says whether the action succeeded, and what it saw.
type result struct {
	OK     bool     `json:"ok"`
	Error  string   `json:"error,omitempty"`
	Output string   `json:"output,omitempty"`
	Items  []string `json:"items,omitempty"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		kernelChild(os.Args[2:])
		return
	}
	addr := ":8080"
	if v := os.Getenv("SANDBOX_ADDR"); v != "" {
		addr = v
	}
	var zone dnsZone
	if v := os.Getenv("SANDBOX_DNS_ZONE"); v != "" {
		z, err := parseZone(v)
		if err != nil {
			log.Fatalf("SANDBOX_DNS_ZONE: %v", err)
		}
		zone = z
	}
	if dns := os.Getenv("SANDBOX_DNS_ADDR"); dns != "" {
		// The tests' stand-in for a resolver outside the cluster.
		go serveDNS(dns, zone)
	}
	// SANDBOX_TLS_ADDR serves the same API over TLS, with a certificate
	// made now for SANDBOX_TLS_NAMES and the address's IP.
	var cert *tls.Certificate
	tlsAddr := os.Getenv("SANDBOX_TLS_ADDR")
	if tlsAddr != "" {
		ip, _, err := net.SplitHostPort(tlsAddr)
		if err != nil {
			log.Fatalf("SANDBOX_TLS_ADDR=%q: %v", tlsAddr, err)
		}
		if net.ParseIP(ip) == nil {
			ip = "" // a name or nothing: no IP SAN
		}
		c, err := selfSigned(tlsNames(os.Getenv("SANDBOX_TLS_NAMES")), ip)
		if err != nil {
			log.Fatal(err)
		}
		cert = &c
		log.Printf("TLS certificate sha256 %s for %v %s", certFingerprint(c.Certificate[0]), c.Leaf.DNSNames, ip)
	}
	mux := newMux(cert)
	// STANDIN_START_DELAY (a duration) holds the server back, as a slow
	// image would be: tests set it per request (the create's env) to see
	// waits that outlast the platform's own timeouts.
	if v := os.Getenv("STANDIN_START_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 5*time.Minute {
			log.Fatalf("STANDIN_START_DELAY=%q: want a duration between 0 and 5m", v)
		}
		log.Printf("waiting %s before serving (STANDIN_START_DELAY)", d)
		time.Sleep(d)
	}
	if cert != nil {
		tlsSrv := &http.Server{
			Addr: tlsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{*cert}},
		}
		log.Printf("sandbox stand-in on %s (TLS)", tlsAddr)
		go func() { log.Fatal(tlsSrv.ListenAndServeTLS("", "")) }()
	}
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("sandbox stand-in on %s", addr)
	log.Fatal(srv.ListenAndServe())
}

// sandboxInfo is GET /v1/sandbox's answer: DeerFlow's client and the
// readiness probes look for status ok, tests for the host (the Pod's
// name); the Host header and the SNI (over TLS) show what name a request
// that came through a proxy carried to its end.
type sandboxInfo struct {
	Status     string `json:"status"`
	Host       string `json:"host"`
	HostHeader string `json:"host_header"`
	SNI        string `json:"sni,omitempty"`
}

// newMux is the stand-in's API, served over HTTP and (with cert) TLS.
func newMux(cert *tls.Certificate) *http.ServeMux {
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandbox", func(w http.ResponseWriter, r *http.Request) {
		info := sandboxInfo{Status: "ok", Host: host, HostHeader: r.Host}
		if r.TLS != nil {
			info.SNI = r.TLS.ServerName
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(info)
	})
	mux.HandleFunc("GET /v1/cert", func(w http.ResponseWriter, r *http.Request) {
		if cert == nil {
			http.Error(w, "no TLS here (SANDBOX_TLS_ADDR is not set)", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, certFingerprint(cert.Certificate[0]))
	})
	mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
		var a action
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(run(r.Context(), a))
	})
	return mux
}

func run(ctx context.Context, a action) result {
	timeout := 2 * time.Second
	if a.TimeoutMs > 0 {
		timeout = time.Duration(a.TimeoutMs) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fail := func(err error) result { return result{Error: err.Error()} }
	switch a.Op {
	case "connect":
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a.Addr)
		if err != nil {
			return fail(err)
		}
		c.Close()
		return result{OK: true}
	case "http":
		method := a.Method
		if method == "" {
			method = http.MethodGet
		}
		req, err := http.NewRequestWithContext(ctx, method, a.URL, strings.NewReader(a.Body))
		if err != nil {
			return fail(err)
		}
		for k, v := range a.Headers {
			req.Header.Set(k, v)
		}
		if a.Host != "" {
			req.Host = a.Host
			// Through a proxy, Go's client writes the Host header's
			// name into the absolute-form request line too, so the two
			// always agree. An opaque URL is written as it is: the
			// request line keeps the URL's host, the Host header says
			// a.Host, as a hand-made request can.
			if req.URL.Scheme == "http" {
				if p, err := http.ProxyFromEnvironment(req); err == nil && p != nil {
					req.URL.Opaque = "//" + req.URL.Host + req.URL.EscapedPath()
				}
			}
		}
		// Through the proxy the environment names (HTTP_PROXY,
		// HTTPS_PROXY, NO_PROXY), as most clients in a sandbox go.
		client := http.DefaultClient
		if a.Insecure {
			tr := http.DefaultTransport.(*http.Transport).Clone() // keeps Proxy: http.ProxyFromEnvironment
			tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
			defer tr.CloseIdleConnections()
			client = &http.Client{Transport: tr}
		}
		resp, err := client.Do(req)
		if err != nil {
			return fail(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		out := fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		if resp.TLS != nil {
			// Which certificate the client saw: the server's own
			// (GET /v1/cert) unless something in between answered.
			out += "\ncert=" + peerFingerprint(resp.TLS)
		}
		return result{OK: true, Output: out}
	case "timing":
		return timeFirstBytes(ctx, a.URL, a.N, a.Concurrency)
	case "tunnel":
		return tunnel(ctx, a)
	case "dns":
		// A resolver that asks only the given server, as code that ignores
		// the Pod's resolv.conf would.
		res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "udp", a.Server)
		}}
		addrs, err := res.LookupHost(ctx, a.Name)
		if err != nil {
			return fail(err)
		}
		return result{OK: true, Items: addrs}
	case "symlink":
		if err := os.Symlink(a.Target, a.Path); err != nil {
			return fail(err)
		}
		return result{OK: true}
	case "list":
		entries, err := os.ReadDir(a.Path)
		if err != nil {
			return fail(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return result{OK: true, Items: names}
	case "kernel":
		return kernelProbe(a.Name)
	case "read":
		f, err := os.Open(a.Path)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 4096))
		if err != nil {
			return fail(err)
		}
		return result{OK: true, Output: string(b)}
	}
	return result{Error: "unknown op " + a.Op}
}

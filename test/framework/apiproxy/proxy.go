// Package apiproxy is a test-only reverse proxy in front of the API server.
// The function under test talks to it over plain HTTP on loopback; it talks
// to the API server with the cluster's admin credentials. On the way it
// counts requests, can inject latency and failures, and can impersonate a
// ServiceAccount, so tests observe exactly what the function asks of
// Kubernetes and how it fares when the API server fails.
package apiproxy

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// Proxy is a running proxy.
type Proxy struct {
	URL string

	mu          sync.Mutex
	counts      map[string]int // "VERB resource" -> count
	delay       atomic.Int64   // nanoseconds added before each non-watch request
	impersonate atomic.Value   // string user, "" for none
	srv         *http.Server

	watches, maxWatches atomic.Int64 // watches open now, and the most open at once since Reset

	faults atomic.Pointer[func(*http.Request) Fault]
}

// Fault is what the proxy does with one request in place of forwarding it
// plainly.
type Fault int

const (
	// Forward forwards the request: no fault.
	Forward Fault = iota
	// FailBefore answers 503 without forwarding: nothing was done.
	FailBefore
	// FailAfter forwards the request and answers 500 in place of the API
	// server's answer: whatever it wrote was written, and the caller
	// cannot know.
	FailAfter
	// Slow forwards the request after a pause of up to SlowBy.
	Slow
)

// SlowBy bounds the pause of a Slow request.
const SlowBy = 300 * time.Millisecond

// SetFaults makes decide choose the fault of every later request that is
// not a watch (nil: none). decide runs concurrently.
func (p *Proxy) SetFaults(decide func(*http.Request) Fault) {
	if decide == nil {
		p.faults.Store(nil)
		return
	}
	p.faults.Store(&decide)
}

func (p *Proxy) fault(r *http.Request) Fault {
	if d := p.faults.Load(); d != nil {
		return (*d)(r)
	}
	return Forward
}

// Start proxies to the API server described by rc.
func Start(rc *rest.Config) (*Proxy, error) {
	target, err := url.Parse(rc.Host)
	if err != nil {
		return nil, err
	}
	transport, err := rest.TransportFor(rc)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{URL: "http://" + ln.Addr().String(), counts: map[string]int{}}
	p.impersonate.Store("")
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			if user := p.impersonate.Load().(string); user != "" {
				r.Out.Header.Set("Impersonate-User", user)
			}
		},
		Transport:     transport,
		FlushInterval: -1, // stream watches
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		watch := r.URL.Query().Get("watch") == "true"
		p.record(r)
		if watch {
			n := p.watches.Add(1)
			defer p.watches.Add(-1)
			for m := p.maxWatches.Load(); n > m && !p.maxWatches.CompareAndSwap(m, n); m = p.maxWatches.Load() {
			}
		}
		if d := time.Duration(p.delay.Load()); d > 0 && !watch {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		if !watch {
			switch p.fault(r) {
			case FailBefore:
				failure(w, http.StatusServiceUnavailable, "ServiceUnavailable", "injected by the test proxy")
				return
			case Slow:
				select {
				case <-time.After(time.Duration(rand.Int64N(int64(SlowBy)))):
				case <-r.Context().Done():
					return
				}
			case FailAfter:
				rp.ServeHTTP(httptest.NewRecorder(), r)
				failure(w, http.StatusInternalServerError, "InternalError", "injected by the test proxy after the API server's answer")
				return
			}
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// failure answers as the API server answers a failure: a Status.
func failure(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":%q,"reason":%q,"code":%d}`, message, reason, code)
}

// Close stops the proxy.
func (p *Proxy) Close() { _ = p.srv.Close() }

// SetDelay makes every later request wait d before it is forwarded.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Impersonate makes every later request act as user ("" stops).
func (p *Proxy) Impersonate(user string) { p.impersonate.Store(user) }

func (p *Proxy) record(r *http.Request) {
	key := r.Method + " " + resourceOf(r.URL.Path)
	if r.URL.Query().Get("watch") == "true" {
		key = "WATCH " + resourceOf(r.URL.Path)
	}
	p.mu.Lock()
	p.counts[key]++
	p.mu.Unlock()
}

// Reset clears the counts.
func (p *Proxy) Reset() {
	p.mu.Lock()
	p.counts = map[string]int{}
	p.mu.Unlock()
	p.maxWatches.Store(p.watches.Load())
}

// OpenWatches is how many watches are open now.
func (p *Proxy) OpenWatches() int { return int(p.watches.Load()) }

// MaxWatches is the most watches that were open at once since Reset.
func (p *Proxy) MaxWatches() int { return int(p.maxWatches.Load()) }

// Counts returns a copy of the counts, keyed "METHOD resource".
func (p *Proxy) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.counts))
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

// Total returns the number of requests counted, excluding the readiness
// probes of /readyz (they are not part of any operation).
func (p *Proxy) Total() int {
	n := 0
	for k, v := range p.Counts() {
		if !strings.HasSuffix(k, " readyz") {
			n += v
		}
	}
	return n
}

func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == "namespaces" && i+2 < len(parts) {
			return parts[i+2]
		}
	}
	if len(parts) > 0 {
		return parts[len(parts)-1]
	}
	return ""
}

// WriteKubeconfig writes a kubeconfig that points at the proxy and returns its path.
func (p *Proxy) WriteKubeconfig(dir string) (string, error) {
	path := filepath.Join(dir, "proxy-kubeconfig.yaml")
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: proxy
  cluster:
    server: %s
contexts:
- name: proxy
  context: {cluster: proxy, user: proxy}
current-context: proxy
users:
- name: proxy
  user: {}
`, p.URL)
	return path, os.WriteFile(path, []byte(content), 0o600)
}

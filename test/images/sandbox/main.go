// Command sandbox stands in for DeerFlow's sandbox image on the real test
// node. It answers what DeerFlow's client and our readiness probe use
// (GET /v1/sandbox) and, for the attack tests, POST /v1/exec: a fixed set of
// actions that hostile code inside a sandbox would try (connect anywhere,
// query any DNS server, plant symlinks, read files, call into the kernel).
// It is a test image: it exists to behave like an attacker, and is never
// deployed.
package main

import (
	"context"
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
	Method    string            `json:"method,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Body      string            `json:"body,omitempty"`
	Server    string            `json:"server,omitempty"` // dns: ip:port
	Name      string            `json:"name,omitempty"`   // dns; kernel: the probe (kernel.go)
	Path      string            `json:"path,omitempty"`   // read, list, symlink (the link)
	Target    string            `json:"target,omitempty"` // symlink
	TimeoutMs int               `json:"timeout_ms,omitempty"`
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
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandbox", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "{\"status\":\"ok\",\"host\":%q}\n", host)
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
	if dns := os.Getenv("SANDBOX_DNS_ADDR"); dns != "" {
		// The tests' stand-in for a resolver outside the cluster.
		go serveDNS(dns)
	}
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
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Printf("sandbox stand-in on %s", addr)
	log.Fatal(srv.ListenAndServe())
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
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fail(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return result{OK: true, Output: fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))}
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

// serveDNS answers every query on addr (UDP) with one A record, 192.0.2.53:
// just enough of RFC 1035 for a Go resolver to accept the answer.
func serveDNS(addr string) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil || n < 12 {
			continue
		}
		q := buf[12:n]
		end := 0
		for end < len(q) && q[end] != 0 {
			end += int(q[end]) + 1
		}
		if end+5 > len(q) {
			continue
		}
		question := q[:end+5] // name, type, class
		isA := q[end+1] == 0 && q[end+2] == 1
		answers := byte(0)
		if isA {
			answers = 1
		}
		resp := append([]byte{}, buf[:2]...)                          // id
		resp = append(resp, 0x81, 0x80, 0, 1, 0, answers, 0, 0, 0, 0) // response, recursion; 1 question
		resp = append(resp, question...)
		if isA {
			resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 53) // pointer to the name, A, IN, TTL 60
		}
		_, _ = pc.WriteTo(resp, from)
	}
}

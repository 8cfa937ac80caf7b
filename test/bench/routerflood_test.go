//go:build e2e

package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/router"
)

// floodTargets resolves two sandboxes, alice's and bob's, each on an
// address the bench's dialer maps to its own loopback upstream.
type floodTargets map[string]router.Target

func (f floodTargets) Resolve(id string) (router.Target, error) {
	if t, ok := f[id]; ok {
		return t, nil
	}
	return router.Target{}, fmt.Errorf("sandbox %s: %w", id, router.ErrNotFound)
}

// BenchmarkRouterUnderPrincipalFlood measures what one principal's flood
// through the E2B router costs another's requests, on loopback (the
// router's Handler in this process; stand-ins for the two sandboxes:
// loopback HTTP servers answering at once, or holding a stream open).
// Bob sends 200 requests one after another, quiet, then while alice opens
// 600 streams that stay open (past the router's per-principal bound of
// router.DefaultFairness, so the rest are refused 429) and 16
// goroutines send her short requests as fast as they are answered (the
// router paces them to router.DefaultFairness's rate). It
// prints bob's p50 and p99 both ways, their ratio (target: p50 within 2×),
// and how many of alice's requests were served and refused.
func BenchmarkRouterUnderPrincipalFlood(b *testing.B) {
	release := make(chan struct{})
	upstream := func(hold bool) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/stream" {
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			io.WriteString(w, "ok")
		}))
		b.Cleanup(s.Close)
		return s
	}
	aliceUp, bobUp := upstream(true), upstream(false)
	key := access.Key(strings.Repeat("k", 40))
	targets := floodTargets{
		"alice1": {Pod: "alice1", IP: "10.0.0.1", Ports: []int32{8080}, Sandbox: access.Sandbox{Principal: "alice", ID: "alice1", CreatedAt: "2026-12-02T00:00:00Z"}},
		"bob1":   {Pod: "bob1", IP: "10.0.0.2", Ports: []int32{8080}, Sandbox: access.Sandbox{Principal: "bob", ID: "bob1", CreatedAt: "2026-12-02T00:00:00Z"}},
	}
	ups := map[string]string{"10.0.0.1:8080": aliceUp.Listener.Addr().String(), "10.0.0.2:8080": bobUp.Listener.Addr().String()}
	h := router.New(router.Options{Resolver: targets, Key: key, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, ups[addr])
		}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	request := func(id, path string) *http.Request {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set(router.HeaderSandboxID, id)
		req.Header.Set(router.HeaderSandboxPort, "8080")
		req.Header.Set(router.HeaderTrafficToken, key.Token(access.Traffic, targets[id].Sandbox))
		return req
	}
	bobClient := &http.Client{Timeout: 10 * time.Second}
	bobRun := func() []time.Duration {
		var ds []time.Duration
		for i := 0; i < 200; i++ {
			t0 := time.Now()
			resp, err := bobClient.Do(request("bob1", "/"))
			if err != nil {
				b.Fatalf("bob's request: %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("bob's request: %d", resp.StatusCode)
			}
			ds = append(ds, time.Since(t0))
		}
		return ds
	}
	bobRun() // warm-up: connections made
	quiet := bobRun()

	var served, refused atomic.Int64
	var wg sync.WaitGroup
	streamClient := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 700}}
	for i := 0; i < 600; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := streamClient.Do(request("alice1", "/stream"))
			if err != nil {
				return
			}
			if resp.StatusCode == http.StatusTooManyRequests {
				refused.Add(1)
			} else {
				served.Add(1)
			}
			io.Copy(io.Discard, resp.Body) // until released
			resp.Body.Close()
		}()
	}
	stop := make(chan struct{})
	hammer := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 100_000; n++ { // bounded: the run ends at stop long before
				select {
				case <-stop:
					return
				default:
				}
				resp, err := hammer.Do(request("alice1", "/"))
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
				} else {
					served.Add(1)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // the streams open, the hammer runs
	flooded := bobRun()
	close(stop)
	close(release)
	wg.Wait()

	var md strings.Builder
	fmt.Fprintf(&md, "# Benchmark RouterUnderPrincipalFlood %s\n\n| bob's requests through the router | n | p50 ms | p99 ms |\n|---|---|---|---|\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&md, "| quiet | %d | %.2f | %.2f |\n", len(quiet), pct(quiet, .5), pct(quiet, .99))
	fmt.Fprintf(&md, "| while alice floods | %d | %.2f | %.2f |\n", len(flooded), pct(flooded, .5), pct(flooded, .99))
	ratio := pct(flooded, .5) / pct(quiet, .5)
	verdict := "met"
	if ratio > 2 {
		verdict = "NOT met"
	}
	fmt.Fprintf(&md, "\nbob's p50 under the flood is %.2f× his quiet p50 (target ≤ 2×: %s). Alice: 600 streams held open and 16 goroutines of short requests; %d served, %d refused with 429 (the router's bounds per principal per replica: %d open, %g started a second).\n",
		ratio, verdict, served.Load(), refused.Load(), router.DefaultFairness.MaxInProgress, router.DefaultFairness.RequestsPerSecond)
	fmt.Println(md.String())
	b.ReportMetric(pct(quiet, .5), "quiet-p50-ms")
	b.ReportMetric(pct(flooded, .5), "flooded-p50-ms")
	b.ReportMetric(ratio, "flooded-vs-quiet-x")
}

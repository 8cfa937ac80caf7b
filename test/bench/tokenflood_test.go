//go:build e2e

package bench

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// floodAudience is the audience the function accepts tokens for here.
const floodAudience = "sandbox-provisioner-bench"

// forgedToken is what an attacker who can reach the function sends: a JWT
// with the right audience and a future expiry (so only the API server can
// refuse it), a fresh subject each time (so no cache knows it) and a
// signature that is not one.
func forgedToken() string {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"aud": []string{floodAudience}, "exp": time.Now().Add(time.Hour).Unix(),
		"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:bench:forged-" + hex.EncodeToString(nonce[:])})
	return enc([]byte(`{"alg":"RS256","kid":"forged"}`)) + "." + enc(claims) + "." + enc(nonce[:])
}

// flood offers forged tokens to fn at rate per second over loopback, each
// request on its own goroutine (so a slow answer does not slow the flood)
// with at most inflight outstanding, until stop is closed or max requests
// were sent (a bounded loop), and counts the answers by status.
type flood struct {
	sent, skipped atomic.Int64
	mu            sync.Mutex
	codes         map[int]int
}

func (f *flood) run(fn *function.Instance, rate, inflight int, max int64, stop <-chan struct{}) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: inflight}}
	slots := make(chan struct{}, inflight)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if f.sent.Load() >= max {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			f.skipped.Add(1) // inflight requests outstanding: the function is not keeping up
			continue
		}
		f.sent.Add(1)
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			req, _ := http.NewRequest("POST", fn.URL+"/api/sandboxes", strings.NewReader(`{"sandbox_id":"forged"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+forgedToken())
			code := -1
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
				code = resp.StatusCode
			}
			f.mu.Lock()
			f.codes[code]++
			f.mu.Unlock()
		}()
	}
}

// tokenReviews reads how many TokenReviews the function sent, from its
// own metrics.
func tokenReviews(fn *function.Instance) (int, error) {
	resp, err := fn.Client.Get(fn.URL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "sandbox_provisioner_kube_requests_total{") && strings.Contains(line, `resource="tokenreviews"`) {
			fields := strings.Fields(line)
			v, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
			n += int(v)
		}
	}
	return n, sc.Err()
}

// BenchmarkCreateUnderTokenFlood measures creates with the API key while
// forged bearer tokens arrive at 100 per second (twice the default client
// rate, K8S_CLIENT_QPS=50, and five times AUTH_TOKEN_REVIEW_QPS: were the
// reviews on the sandbox operations' client, they alone would exhaust it),
// against the same creates with no flood,
// alternating in chunks so both see the same API server. Refused tokens are
// cached by hash and TokenReviews have their own limiter and client
// (AUTH_TOKEN_REVIEW_QPS/BURST), so the flood costs the creates a little
// CPU, not the client rate. The target, create p50 under the flood within
// 1.2x of the quiet p50, is reported as met or not, as BenchmarkProvisioner
// reports its targets; a failed create, or a forged token that is not
// refused, fails the benchmark. The function keeps its deployed defaults.
func BenchmarkCreateUnderTokenFlood(b *testing.B) {
	kc := benchCluster(b, "flood", 2)
	defer kc.Down()
	useNamespace(b, kc)
	env := function.BaseEnv(kc.Kubeconfig, ns)
	env["MAX_SANDBOXES"] = "5000"
	env["AUTH_TOKEN_AUDIENCE"] = floodAudience
	env["AUTH_ALLOWED_SUBJECTS"] = "system:serviceaccount:" + ns + ":trigger"
	fn, err := function.StartBinary(binary(b), env, filepath.Join(b.TempDir(), "fn.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer fn.Stop()
	for i := 0; i < 20; i++ {
		_ = ours(fn, "POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("warm-%d", i)})
	}

	const (
		n, chunk        = 200, 10
		rate, inflight  = 100, 64
		maxFloodPerRun  = 200_000
		floodSettleTime = 200 * time.Millisecond
	)
	fl := &flood{codes: map[int]int{}}
	var quiet, flooded sample
	var floodTime time.Duration
	progress("creates at concurrency 1, alternating %d quiet and %d flooded chunks of %d (forged tokens at %d/s)", n/chunk/2, n/chunk/2, chunk, rate)
	for start := 0; start < n; start += chunk {
		off := start
		create := func(i int) error {
			return ours(fn, "POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("fl-%d", off+i)})
		}
		if (start/chunk)%2 == 0 {
			s := run(chunk, 1, create)
			quiet.d, quiet.err, quiet.all = append(quiet.d, s.d...), quiet.err+s.err, quiet.all+s.all
			continue
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		began := time.Now()
		go func() { fl.run(fn, rate, inflight, maxFloodPerRun, stop); close(done) }()
		time.Sleep(floodSettleTime) // the flood is under way before the first create
		s := run(chunk, 1, create)
		close(stop)
		<-done
		floodTime += time.Since(began)
		flooded.d, flooded.err, flooded.all = append(flooded.d, s.d...), flooded.err+s.err, flooded.all+s.all
	}
	reviews, err := tokenReviews(fn)
	if err != nil {
		b.Fatal(err)
	}
	q50, f50 := pct(quiet.d, .5), pct(flooded.d, .5)
	q95, f95 := pctText(quiet.d, .95, "%.2f"), pctText(flooded.d, .95, "%.2f")
	ratio := f50 / q50
	fmt.Printf("\n# Create under a flood of forged tokens (%s)\n\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("| | n | p50 ms | p95 ms | errors |\n|---|---|---|---|---|\n")
	fmt.Printf("| no flood | %d | %.2f | %s | %d |\n", len(quiet.d), q50, q95, quiet.err)
	fmt.Printf("| forged tokens at %d/s | %d | %.2f | %s | %d |\n\n", rate, len(flooded.d), f50, f95, flooded.err)
	fmt.Printf("flood: %d forged requests in %.1f s (%.0f/s achieved; %d not sent, %d outstanding), answers %v; TokenReviews sent: %d (AUTH_TOKEN_REVIEW_QPS 5, burst 10)\n",
		fl.sent.Load(), floodTime.Seconds(), float64(fl.sent.Load())/floodTime.Seconds(), fl.skipped.Load(), inflight, fl.codes, reviews)
	fmt.Printf("create p50 under the flood / without: %.2fx (target <= 1.2x, met: %v)\n", ratio, ratio <= 1.2)
	if quiet.err+flooded.err > 0 {
		b.Errorf("%d creates failed", quiet.err+flooded.err)
	}
	if fl.codes[200] > 0 || fl.codes[-1] > 0 {
		b.Errorf("forged tokens answered %v: none may succeed or go unanswered", fl.codes)
	}
}

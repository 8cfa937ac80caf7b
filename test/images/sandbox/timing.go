package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// timeFirstBytes makes n GET requests to url, concurrency at a time, each
// on a new connection (through the environment's proxy, if any: a new
// CONNECT and TLS handshake each), and returns each request's time to its
// response's first byte in microseconds, as the benchmarks compare them.
// The sandbox measures from inside, so the test's own round trip to the
// sandbox is in none of the samples.
func timeFirstBytes(ctx context.Context, url string, n, concurrency int) result {
	if n < 1 || n > 1000 || concurrency < 1 || concurrency > 64 {
		return result{Error: "timing: want 1 ≤ n ≤ 1000 and 1 ≤ concurrency ≤ 64"}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} // the test host's certificate is its own
	client := &http.Client{Transport: tr}
	var (
		mu      sync.Mutex
		samples []string
		first   error
		wg      sync.WaitGroup
	)
	next := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		next <- struct{}{}
	}
	close(next)
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				start := time.Now()
				resp, err := client.Do(req)
				took := time.Since(start)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s answered %d", url, resp.StatusCode)
					}
				}
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				if err == nil {
					samples = append(samples, strconv.FormatInt(took.Microseconds(), 10))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return result{Error: first.Error(), Items: samples}
	}
	return result{OK: true, Items: samples}
}

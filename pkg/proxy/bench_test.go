package proxy

import (
	"io"
	"testing"
)

// BenchmarkProxyHTTPS: one HTTPS request through the proxy per operation,
// each on a new connection (a CONNECT, the lookup, the dial, the
// ClientHello check, the copy), to a local TLS server standing in for the
// internet (the test's Dial seam). The client and the server are in the
// same process: profile with -cpuprofile and focus on Server to see the
// proxy's own share.
func BenchmarkProxyHTTPS(b *testing.B) {
	e := newEnv(b)
	c := e.client(srcExact)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.Get("https://example.com/")
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
}

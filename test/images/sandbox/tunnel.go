package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// tunnel is the "tunnel" action: what code does that speaks to the egress
// proxy itself instead of through an HTTP library. It asks the proxy named
// in HTTPS_PROXY to CONNECT to a.Addr; a refusal fails the action with the
// proxy's status and body. Through the tunnel it sends GET /v1/sandbox:
// over TLS with SNI a.SNI when that is set (or a.ECH, then with an
// Encrypted Client Hello), else in the clear with Host a.Host (default:
// a.Addr's host). The output is the answer's status and body, and for TLS
// the server certificate's fingerprint (cert=…).
func tunnel(ctx context.Context, a action) result {
	out, err := tunnelGet(ctx, a)
	if err != nil {
		return result{Error: err.Error()}
	}
	return result{OK: true, Output: out}
}

func tunnelGet(ctx context.Context, a action) (string, error) {
	proxy, err := envProxy()
	if err != nil {
		return "", err
	}
	targetHost, _, err := net.SplitHostPort(a.Addr)
	if err != nil {
		return "", fmt.Errorf("tunnel addr %q: %w", a.Addr, err)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", proxy)
	if err != nil {
		return "", fmt.Errorf("dial the proxy %s: %w", proxy, err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", a.Addr, a.Addr); err != nil {
		return "", fmt.Errorf("send CONNECT %s to %s: %w", a.Addr, proxy, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "", fmt.Errorf("CONNECT %s through %s: read the answer: %w", a.Addr, proxy, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return "", fmt.Errorf("CONNECT %s through %s: %s: %s", a.Addr, proxy, resp.Status, strings.TrimSpace(string(body)))
	}
	// What the proxy sent after its answer (the far end's first bytes)
	// may sit in br already: the tunnel reads through it.
	tun := &bufferedConn{Conn: conn, r: br}

	if a.SNI == "" && !a.ECH {
		host := a.Host
		if host == "" {
			host = targetHost
		}
		return getSandbox(tun, host)
	}

	sni := a.SNI
	if sni == "" {
		sni = targetHost
	}
	cfg := &tls.Config{
		ServerName:         sni,
		InsecureSkipVerify: true, // the far end's certificate is self-signed; cert= shows which it was
		NextProtos:         []string{"http/1.1"},
	}
	if a.ECH {
		key, err := ecdh.X25519().GenerateKey(rand.Reader)
		if err != nil {
			return "", fmt.Errorf("generate an ECH key: %w", err)
		}
		id := make([]byte, 1)
		if _, err := rand.Read(id); err != nil {
			return "", fmt.Errorf("draw an ECH config id: %w", err)
		}
		_, list, err := echConfig(id[0], key.PublicKey(), sni)
		if err != nil {
			return "", err
		}
		cfg.MinVersion = tls.VersionTLS13 // ECH is TLS 1.3's
		cfg.EncryptedClientHelloConfigList = list
		// No server holds this key, so one that got the hello past the
		// proxy rejects ECH: the handshake then ends in an
		// ECHRejectionError ("tls: server rejected ECH"), not in a
		// verification of the outer name against roots nobody has.
		cfg.EncryptedClientHelloRejectionVerify = func(tls.ConnectionState) error { return nil }
	}
	tc := tls.Client(tun, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return "", fmt.Errorf("TLS handshake (SNI %q, ECH %v) through the tunnel to %s: %w%s", sni, a.ECH, a.Addr, err, notTLS(err, tun))
	}
	host := a.Host
	if host == "" {
		host = sni
	}
	out, err := getSandbox(tc, host)
	if err != nil {
		return "", err
	}
	cs := tc.ConnectionState()
	return out + "\ncert=" + peerFingerprint(&cs), nil
}

// getSandbox sends GET /v1/sandbox with Host host on c and returns the
// answer's status code and body.
func getSandbox(c net.Conn, host string) (string, error) {
	if _, err := fmt.Fprintf(c, "GET /v1/sandbox HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", fmt.Errorf("send GET /v1/sandbox through the tunnel: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodGet})
	if err != nil {
		return "", fmt.Errorf("GET /v1/sandbox through the tunnel: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body))), nil
}

// notTLS is what came instead of a TLS handshake, when what came was not
// TLS: an egress proxy that refuses inside a tunnel may answer in HTTP
// ("HTTP/1.1 403 …"), and its reason is what a test looks for. The TLS
// client has read part of it (maybe all) into buffers of its own; tun has
// kept a copy.
func notTLS(err error, tun *bufferedConn) string {
	var rh tls.RecordHeaderError
	if !errors.As(err, &rh) {
		return ""
	}
	_ = tun.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(tun, maxFirst))
	raw := tun.first
	if resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil); err == nil {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Sprintf("; the tunnel answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return fmt.Sprintf("; the tunnel answered %q", raw)
}

// envProxy is the host:port of the proxy HTTPS_PROXY (or https_proxy)
// names, as an HTTP client reads it.
func envProxy() (string, error) {
	v := os.Getenv("HTTPS_PROXY")
	if v == "" {
		v = os.Getenv("https_proxy")
	}
	if v == "" {
		return "", errors.New("tunnel: HTTPS_PROXY is not set")
	}
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	u, err := url.Parse(v)
	if err != nil {
		return "", fmt.Errorf("tunnel: HTTPS_PROXY %q: %w", v, err)
	}
	if u.Scheme != "http" {
		return "", fmt.Errorf("tunnel: HTTPS_PROXY %q: only an http:// proxy is supported", v)
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// maxFirst is how much of what comes through a tunnel bufferedConn keeps.
const maxFirst = 1024

// bufferedConn reads through r, which holds what was read ahead of the
// tunnel's first bytes, and keeps a copy of the first of them (first):
// what to show when they were not what the reader expected.
type bufferedConn struct {
	net.Conn
	r     *bufio.Reader
	first []byte
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if room := maxFirst - len(c.first); room > 0 {
		c.first = append(c.first, p[:min(n, room)]...)
	}
	return n, err
}

package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// extensionECH is the Encrypted ClientHello extension's code point
// (draft-ietf-tls-esni), which hides the real server name from the proxy.
const extensionECH = 0xfe0d

// alertAccessDenied is a fatal TLS access_denied alert record, in the
// clear: what a client gets when its handshake is refused after the 200.
var alertAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49}

// open is what both doors do first: identify the caller, run the door's
// own check of the request and give its target (host:port), admit it, and
// dial the judged addresses. A refusal is recorded and answered here (403,
// or 502 for an upstream that cannot be had), and open returns nil.
func (s *Server) open(ctx context.Context, c net.Conn, r *request, target func() (string, *refusal)) (net.Conn, netip.AddrPort) {
	pol, ref := s.identify(ctx, r)
	var addrs []netip.Addr
	release := func() {}
	if ref == nil {
		var ok bool
		if release, ok = s.perPrincipal.Take(pol.Principal, cmp.Or(s.MaxPerPrincipal, DefaultMaxPerPrincipal)); !ok {
			release = func() {}
			ref = &refusal{status: http.StatusTooManyRequests, reason: ReasonTooMany,
				msg: fmt.Sprintf("this sandbox's principal has %d connections open through the egress proxy; close some or retry", cmp.Or(s.MaxPerPrincipal, DefaultMaxPerPrincipal))}
		}
	}
	if ref == nil {
		var t string
		if t, ref = target(); ref == nil {
			addrs, ref = s.admit(ctx, r, pol, t)
		}
	}
	var (
		up net.Conn
		ap netip.AddrPort
	)
	if ref == nil {
		up, ap, ref = s.dial(ctx, r, addrs)
	}
	if ref != nil {
		release()
		s.record(r, ref)
		writeStatus(c, ref.status, ref.body())
		return nil, ap
	}
	return counted{Conn: up, release: release}, ap
}

// connect serves a CONNECT: the checks, the upstream connection, the 200,
// then a look at what the client sends first (its TLS server name or its
// HTTP Host must be the CONNECT host) before the bytes flow.
func (s *Server) connect(ctx context.Context, c net.Conn, br *bufio.Reader, req *http.Request, r *request) {
	up, ap := s.open(ctx, c, r, func() (string, *refusal) {
		if req.URL == nil || req.URL.Host == "" {
			return "", badRequest("CONNECT wants host:port, got %q", req.RequestURI)
		}
		return req.URL.Host, nil
	})
	if up == nil {
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}

	c.SetReadDeadline(time.Now().Add(s.headerTimeout()))
	preface, isTLS, ref := s.inspect(c, br, r)
	c.SetReadDeadline(time.Time{})
	if ref != nil {
		s.record(r, ref)
		switch {
		case isTLS:
			c.Write(alertAccessDenied)
		case len(preface) > 0:
			writeStatus(c, http.StatusForbidden, ref.body())
		}
		return
	}
	s.allowed(r, ap)
	s.pipe(c, br, up, preface)
}

// inspect reads the client's first bytes in the tunnel without losing
// them: it returns what it read (to send upstream first), whether they
// start a TLS record, and a refusal when they do not go to r.host.
func (s *Server) inspect(c net.Conn, br *bufio.Reader, r *request) ([]byte, bool, *refusal) {
	first, err := br.Peek(1)
	if err != nil {
		return nil, false, badRequest("the client sent nothing in the tunnel within %s: %v", s.headerTimeout(), err)
	}
	if first[0] == 0x16 { // a TLS handshake record
		rec, ref := s.inspectTLS(c, br, r)
		return rec, true, ref
	}
	return s.inspectHTTP(br, r)
}

var errHelloRead = errors.New("egress proxy: ClientHello read")

// inspectTLS lets crypto/tls parse the ClientHello (a server that records
// what it reads, writes nothing and stops as soon as it has the hello) and
// checks its server name.
func (s *Server) inspectTLS(c net.Conn, br *bufio.Reader, r *request) ([]byte, *refusal) {
	rc := &recordingConn{Conn: c, r: br}
	var hello *tls.ClientHelloInfo
	cfg := &tls.Config{
		// With no ECH keys configured, the server hands over the outer
		// hello as is (a malformed ECH extension fails before this call,
		// and is refused for want of a hello).
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = chi
			return nil, errHelloRead
		},
	}
	err := tls.Server(rc, cfg).Handshake()
	rec := rc.rec.Bytes()
	if hello == nil {
		return rec, refuse(ReasonBadRequest, "could not read a TLS ClientHello in the tunnel to %s: %v", r.host, err)
	}
	if slices.Contains(hello.Extensions, extensionECH) {
		return rec, refuse(ReasonECH, "the TLS ClientHello to %s uses Encrypted ClientHello, which hides the server name; turn ECH off for proxied connections", r.host)
	}
	// r.host is never empty, so neither may the server name be.
	if sni := strings.TrimSuffix(hello.ServerName, "."); !strings.EqualFold(sni, r.host) {
		return rec, refuse(ReasonSNI, "the TLS server name %q is not %s, the host this tunnel was opened to; they must agree", hello.ServerName, r.host)
	}
	return rec, nil
}

// inspectHTTP reads the head of the client's first HTTP request in the
// tunnel and checks its Host.
func (s *Server) inspectHTTP(br *bufio.Reader, r *request) ([]byte, bool, *refusal) {
	var rec bytes.Buffer
	lr := &io.LimitedReader{R: br, N: int64(s.maxHeaderBytes())}
	req, err := http.ReadRequest(bufio.NewReader(io.TeeReader(lr, &rec)))
	if err != nil {
		return rec.Bytes(), false, refuse(ReasonBadRequest,
			"the tunnel to %s carries neither TLS nor an HTTP/1 request head of at most %d bytes: %v", r.host, s.maxHeaderBytes(), err)
	}
	hosts := headerHosts(rec.Bytes())
	switch {
	case len(hosts) != 1:
		return rec.Bytes(), false, refuse(ReasonHostMismatch, "the request in the tunnel to %s carries %d Host headers; send exactly one, %s", r.host, len(hosts), r.host)
	case !sameHost(hosts[0], r.host, r.port), req.URL.Host != "" && !sameHost(req.URL.Host, r.host, r.port):
		return rec.Bytes(), false, refuse(ReasonHostMismatch, "the request's Host %q is not %s, the host this tunnel was opened to; they must agree", hosts[0], r.host)
	}
	return rec.Bytes(), false, nil
}

// recordingConn is the connection crypto/tls reads the ClientHello from:
// it keeps every byte read, so they can be replayed upstream, and swallows
// what the TLS server would write (its alert when stopped).
type recordingConn struct {
	net.Conn
	r   io.Reader
	rec bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.rec.Write(p[:n])
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *recordingConn) Close() error                { return nil }

// pipe sends preface upstream, then copies both ways until both sides
// have closed their half, or until no byte has moved for IdleTimeout.
func (s *Server) pipe(c net.Conn, cr io.Reader, up net.Conn, preface []byte) {
	idle := newIdleTimer(s.idleTimeout(), func() { c.Close(); up.Close() })
	defer idle.stop()
	if len(preface) > 0 {
		if _, err := up.Write(preface); err != nil {
			return
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { copyHalf(up, &activity{r: cr, t: idle}, c) })
	copyHalf(c, &activity{r: up, t: idle}, up)
	wg.Wait()
}

// copyHalf copies one direction; at its end of stream it closes dst's
// write half (the peer sees EOF, the other direction goes on). On an error
// it closes both, which ends the other direction too.
func copyHalf(dst net.Conn, src io.Reader, srcConn net.Conn) {
	_, err := io.Copy(dst, src)
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	dst.Close()
	srcConn.Close()
}

// activity notes each read on an idle timer.
type activity struct {
	r io.Reader
	t *idleTimer
}

func (a *activity) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.t.touch()
	}
	return n, err
}

// idleTimer calls fire once nothing has touched it for d.
type idleTimer struct {
	d       time.Duration
	last    atomic.Int64
	stopped atomic.Bool
	t       *time.Timer
	fire    func()
	mu      sync.Mutex
}

func newIdleTimer(d time.Duration, fire func()) *idleTimer {
	it := &idleTimer{d: d, fire: fire}
	it.touch()
	it.mu.Lock()
	it.t = time.AfterFunc(d, it.check)
	it.mu.Unlock()
	return it
}

func (it *idleTimer) touch() { it.last.Store(time.Now().UnixNano()) }

func (it *idleTimer) check() {
	if it.stopped.Load() {
		return
	}
	quiet := time.Since(time.Unix(0, it.last.Load()))
	if quiet >= it.d {
		it.fire()
		return
	}
	it.mu.Lock()
	it.t.Reset(it.d - quiet)
	it.mu.Unlock()
}

func (it *idleTimer) stop() {
	it.stopped.Store(true)
	it.mu.Lock()
	it.t.Stop()
	it.mu.Unlock()
}

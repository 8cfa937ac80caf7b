// Package proxy is the egress proxy of "allowlist" sandboxes (package
// egress): their only route out of the cluster. A sandbox reaches it through
// HTTP_PROXY/HTTPS_PROXY; the proxy serves CONNECT tunnels (HTTPS, or
// anything else tunnelled) and absolute-form plain HTTP requests, to the
// names on the caller's list only.
//
// The proxy trusts nothing a sandbox says about itself: the caller is who
// its TCP source address says (Lookup), the name is resolved by the proxy
// and every answer judged (egress.Judge) before it dials those very
// addresses, and inside a tunnel the TLS server name (or the HTTP Host) must
// be the name the CONNECT asked for, so a client cannot open a tunnel to an
// allowed name and talk to another host sharing its addresses.
//
// Server is a net.Listener loop, not an http.Handler: net/http's server
// drops the Host header of an absolute-form request (which the proxy must
// compare with the URL), and a loop needs no hijacking for CONNECT. It reads
// each request with http.ReadRequest itself.
package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/bounded"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
)

// Lookup says who is asking, from the TCP source address of the client
// connection. An error means an unknown caller, which is refused.
type Lookup func(ctx context.Context, src netip.Addr) (id string, p egress.Policy, err error)

// Resolver resolves names; *net.Resolver satisfies it. The server asks for
// the rooted name ("example.com."), so no search domain of the proxy's own
// resolv.conf turns a sandbox's name into a cluster name.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// The defaults of Server's bounds.
const (
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultIdleTimeout    = 10 * time.Minute
	DefaultDialTimeout    = 10 * time.Second
	DefaultMaxHeaderBytes = 64 << 10
)

// DefaultPorts are the ports a sandbox may reach when Server.Ports is empty.
var DefaultPorts = []uint16{80, 443}

// Server is the egress proxy. Set Lookup and Resolver; the rest has
// defaults. Do not change its fields once Serve has started.
type Server struct {
	Lookup   Lookup
	Resolver Resolver
	// Deny are ranges refused beside egress's own (the cluster's Pod and
	// Service ranges, when they are public).
	Deny []netip.Prefix
	// Ports are the upstream ports allowed (DefaultPorts when empty).
	Ports []uint16
	// Dial opens the upstream connection to one judged address ("ip:port";
	// network "tcp"). Nil is a net.Dialer's. Tests replace it to reach
	// local servers standing in for public addresses.
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	Log     *slog.Logger
	Metrics *Metrics // nil: none
	Now     func() time.Time

	HeaderTimeout  time.Duration // to read a request head, or a tunnel's first bytes
	IdleTimeout    time.Duration // a tunnel (or forwarded request) with no traffic either way is closed
	DialTimeout    time.Duration // to resolve and connect upstream
	MaxHeaderBytes int
	// ShutdownGrace is how long Serve lets open connections finish once
	// its context is done, before it closes them.
	ShutdownGrace time.Duration
	// MaxPerPrincipal bounds the upstream connections open at once for the
	// sandboxes of one principal (DefaultMaxPerPrincipal): past it, 429,
	// so that one tenant's flood leaves the others their share.
	MaxPerPrincipal int

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// perPrincipal counts the upstream connections per principal.
	perPrincipal bounded.Counts
}

// DefaultMaxPerPrincipal is Server.MaxPerPrincipal's default.
const DefaultMaxPerPrincipal = 256

// counted is an upstream connection that gives its principal's count back
// when closed.
type counted struct {
	net.Conn
	release func()
}

func (c counted) Close() error {
	c.release()
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when it can (a TCP one): a tunnel
// passes a client's half-close on.
func (c counted) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func (s *Server) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

func (s *Server) headerTimeout() time.Duration {
	return cmp.Or(s.HeaderTimeout, DefaultHeaderTimeout)
}

func (s *Server) idleTimeout() time.Duration { return cmp.Or(s.IdleTimeout, DefaultIdleTimeout) }
func (s *Server) dialTimeout() time.Duration { return cmp.Or(s.DialTimeout, DefaultDialTimeout) }
func (s *Server) maxHeaderBytes() int        { return cmp.Or(s.MaxHeaderBytes, DefaultMaxHeaderBytes) }

func (s *Server) ports() []uint16 {
	if len(s.Ports) == 0 {
		return DefaultPorts
	}
	return s.Ports
}

// Serve accepts connections on ln until ctx is done; then it closes ln,
// lets open connections run for ShutdownGrace, closes those left and
// returns once every connection's goroutine has ended.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.Lookup == nil || s.Resolver == nil {
		return errors.New("egress proxy: Lookup and Resolver must be set")
	}
	s.mu.Lock()
	s.conns = map[net.Conn]struct{}{}
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()

	// Connections outlive ctx by the grace period: a SIGTERM should not
	// cut a download that would end in a second.
	connCtx := context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	var acceptErr error
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(err, net.ErrClosed) {
				acceptErr = fmt.Errorf("egress proxy: accepting: %w", err)
				break
			}
			// Out of file descriptors and the like: wait, do not die.
			s.log().Error("egress proxy: accepting", "error", err.Error())
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.track(c, true)
		wg.Go(func() {
			defer s.track(c, false)
			s.serveConn(connCtx, c)
			lingerClose(c)
		})
	}
	ln.Close()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if acceptErr == nil {
		select {
		case <-done:
		case <-time.After(s.ShutdownGrace):
		}
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	<-done
	return acceptErr
}

func (s *Server) track(c net.Conn, add bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if add {
		s.conns[c] = struct{}{}
		s.Metrics.openConns(1)
		return
	}
	delete(s.conns, c)
	s.Metrics.openConns(-1)
}

// lingerClose closes c after a short drain of what the client still
// sends: closing a socket with unread data resets it, and the reset can
// overtake the refusal just written.
func lingerClose(c net.Conn) {
	defer c.Close()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	io.Copy(io.Discard, io.LimitReader(c, 256<<10))
}

// request is one proxy request as the log and the verdict see it.
type request struct {
	src    netip.Addr
	method string
	id     string // the sandbox's, once known
	host   string // lower case, no trailing dot
	port   uint16
}

func (r *request) attrs() []any {
	return []any{"sandbox", r.id, "source", r.src.String(), "method", r.method, "host", r.host, "port", r.port}
}

// refusal is why a request is not served: the status (before a tunnel is
// established), the metric reason and a message saying what to fix.
type refusal struct {
	status int
	reason string
	msg    string
}

func refuse(reason, format string, a ...any) *refusal {
	return &refusal{status: http.StatusForbidden, reason: reason, msg: fmt.Sprintf(format, a...)}
}

// body is the one-line plain-text body of a refusal.
func (r *refusal) body() string {
	word := "refused"
	if r.status >= 500 {
		word = "failed"
	}
	line := strings.Map(func(c rune) rune {
		if c < ' ' || c == 0x7f {
			return ' '
		}
		return c
	}, r.msg)
	return "egress proxy: " + word + ": " + line + "\n"
}

// record logs and counts a refusal.
func (s *Server) record(r *request, ref *refusal) {
	s.Metrics.count(false, ref.reason)
	level := slog.LevelWarn
	if ref.status >= 500 {
		level = slog.LevelError
	}
	s.log().Log(context.Background(), level, "egress refused",
		append(r.attrs(), "verdict", "refused", "reason", ref.reason, "status", ref.status, "detail", ref.msg)...)
}

// writeStatus writes a complete HTTP/1.1 response with a plain-text body
// and asks the client to close.
func writeStatus(w io.Writer, status int, body string) error {
	_, err := fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	return err
}

// headLimit bounds what a request head may take from the connection, and
// records it: net/http's ReadRequest drops the Host header of an
// absolute-form request, which the proxy must compare with the URL, so it
// reads the header again from the record (headerHosts). Both end once the
// head is read (n < 0): a body is the upstream's business. The bufio.Reader
// above it reads ahead, so the bound (and the record) can run past the
// head by up to a buffer's size.
type headLimit struct {
	r   io.Reader
	n   int64 // < 0: unlimited, not recording
	rec bytes.Buffer
}

func (l *headLimit) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(p)
	}
	if l.n == 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	l.rec.Write(p[:n])
	return n, err
}

// endHead lifts the bound and stops recording.
func (l *headLimit) endHead() {
	l.n = -1
	l.rec = bytes.Buffer{}
}

// headerHosts reads the Host header fields of the request head at the start
// of raw (which ReadRequest has already parsed).
func headerHosts(raw []byte) []string {
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(raw)))
	if _, err := tp.ReadLine(); err != nil { // the request line
		return nil
	}
	h, _ := tp.ReadMIMEHeader() // the fields before any error are kept
	return h.Values("Host")
}

var errHeadTooLarge = errors.New("request head too large")

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	r := &request{}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		r.src = ap.Addr().Unmap()
	}
	lim := &headLimit{r: c, n: int64(s.maxHeaderBytes())}
	br := bufio.NewReaderSize(lim, 16<<10)
	c.SetReadDeadline(time.Now().Add(s.headerTimeout()))
	req, err := http.ReadRequest(br)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return // a connection closed without a request is no request
		}
		ref := &refusal{status: http.StatusBadRequest, reason: ReasonBadRequest, msg: "could not read a proxy request: " + err.Error()}
		if errors.Is(err, errHeadTooLarge) {
			ref.status = http.StatusRequestHeaderFieldsTooLarge
			ref.msg = fmt.Sprintf("the request head is larger than %d bytes", s.maxHeaderBytes())
		}
		s.record(r, ref)
		writeStatus(c, ref.status, ref.body())
		return
	}
	hosts := headerHosts(lim.rec.Bytes())
	lim.endHead()
	c.SetReadDeadline(time.Time{})
	r.method = req.Method

	if req.Method == http.MethodConnect {
		s.connect(ctx, c, br, req, r)
		return
	}
	s.forward(ctx, c, req, hosts, r)
}

// identify is the first check of every request: who is asking, by the
// connection's source address.
func (s *Server) identify(ctx context.Context, r *request) (egress.Policy, *refusal) {
	id, pol, err := s.Lookup(ctx, r.src)
	if err != nil {
		return egress.Policy{}, refuse(ReasonUnknownCaller, "the source address %s is no sandbox's: %v", r.src, err)
	}
	r.id = id
	return pol, nil
}

// admit runs the checks after identify, in order, and returns the
// addresses to dial: a name (not an address), an allowed port, the name on
// the caller's list, and every answer for it public. target is host:port
// (the port already defaulted by the caller).
func (s *Server) admit(ctx context.Context, r *request, pol egress.Policy, target string) ([]netip.Addr, *refusal) {
	host, portStr, err := net.SplitHostPort(target)
	if err != nil {
		return nil, badRequest("the target %q is not host:port", target)
	}
	r.host = strings.ToLower(strings.TrimSuffix(host, "."))
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, badRequest("the target %q has no valid port", target)
	}
	r.port = uint16(port)
	if r.host == "" {
		return nil, badRequest("the target %q names no host", target)
	}
	if _, err := netip.ParseAddr(strings.Trim(r.host, "[]")); err == nil {
		return nil, refuse(ReasonIPLiteral, "%s is an IP address; name the host by a DNS name on this sandbox's egress list", r.host)
	}
	if !slices.Contains(s.ports(), r.port) {
		return nil, refuse(ReasonPort, "port %d is not allowed; the proxy reaches ports %s only", r.port, portList(s.ports()))
	}
	if !pol.Allows(r.host, s.now()) {
		if pol.Mode != egress.Allowlist {
			return nil, refuse(ReasonNotListed, "this sandbox's egress mode is %q; only allowlist sandboxes go through the proxy", pol.Mode)
		}
		return nil, refuse(ReasonNotListed, "%s is not on this sandbox's egress list; add it to the template's list or grant it", r.host)
	}

	rctx, cancel := context.WithTimeout(ctx, s.dialTimeout())
	defer cancel()
	answers, err := s.Resolver.LookupNetIP(rctx, "ip", r.host+".")
	if err != nil {
		return nil, &refusal{status: http.StatusBadGateway, reason: ReasonResolve,
			msg: fmt.Sprintf("the name %s did not resolve: %v", r.host, err)}
	}
	addrs, why := egress.Judge(answers, s.Deny)
	if why != "" {
		return nil, refuse(ReasonForbiddenAddress, "%s; every answer must be public", why)
	}
	// IPv4 first: most clusters have no IPv6 route out, and trying a v6
	// address first would cost each connection a timeout there.
	addrs = slices.Clone(addrs)
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int {
		return cmp.Compare(boolInt(!a.Unmap().Is4()), boolInt(!b.Unmap().Is4()))
	})
	return addrs, nil
}

func badRequest(format string, a ...any) *refusal {
	return &refusal{status: http.StatusBadRequest, reason: ReasonBadRequest, msg: fmt.Sprintf(format, a...)}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func portList(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ", ")
}

// dial connects to the judged addresses in turn (never resolving again:
// the addresses judged are the addresses reached).
func (s *Server) dial(ctx context.Context, r *request, addrs []netip.Addr) (net.Conn, netip.AddrPort, *refusal) {
	dial := s.Dial
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	ctx, cancel := context.WithTimeout(ctx, s.dialTimeout())
	defer cancel()
	start := time.Now()
	var errs []error
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a.Unmap(), r.port)
		c, err := dial(ctx, "tcp", ap.String())
		if err == nil {
			s.Metrics.observeConnect(time.Since(start).Seconds())
			return c, ap, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	s.Metrics.observeConnect(time.Since(start).Seconds())
	return nil, netip.AddrPort{}, &refusal{status: http.StatusBadGateway, reason: ReasonUpstream,
		msg: fmt.Sprintf("could not connect to %s port %d: %v", r.host, r.port, errors.Join(errs...))}
}

// allowed logs and counts a request that reached its upstream.
func (s *Server) allowed(r *request, up netip.AddrPort) {
	s.Metrics.count(true, ReasonOK)
	s.log().Info("egress allowed", append(r.attrs(), "verdict", "allowed", "reason", ReasonOK, "upstream", up.String())...)
}

// sameHost says whether hostport (a Host header or a URL's host, with an
// optional port) names host; a port it carries must be port.
func sameHost(hostport, host string, port uint16) bool {
	h, p := strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), ""
	if sh, sp, err := net.SplitHostPort(hostport); err == nil {
		h, p = sh, sp
	}
	if p != "" && p != strconv.Itoa(int(port)) {
		return false
	}
	h = strings.TrimSuffix(h, ".")
	return h != "" && strings.EqualFold(h, host)
}

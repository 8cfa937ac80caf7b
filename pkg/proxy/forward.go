package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
	"time"
)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), and the proxy's own credentials: none is passed
// on.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, f := range strings.Split(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

// forward serves one absolute-form plain HTTP request: the checks, then the
// request to the judged address with the name as Host, and the response
// streamed back. The client connection is closed after one response: plain
// HTTP through the proxy is rare (HTTPS tunnels), and one request per
// connection spares the proxy from tracking request bodies across requests.
func (s *Server) forward(ctx context.Context, c net.Conn, req *http.Request, hosts []string, r *request) {
	up, ap := s.open(ctx, c, r, func() (string, *refusal) {
		if ref := checkForm(req, hosts, r); ref != nil {
			return "", ref
		}
		port := req.URL.Port()
		if port == "" {
			port = "80"
		}
		return net.JoinHostPort(req.URL.Hostname(), port), nil
	})
	if up == nil {
		return
	}
	defer up.Close()
	s.allowed(r, ap)

	removeHopByHop(req.Header)
	req.Host = req.URL.Host
	req.RequestURI = ""
	req.Close = true
	req.Trailer = nil
	if _, ok := req.Header["User-Agent"]; !ok {
		// An absent User-Agent stays absent (Request.Write would add Go's).
		req.Header["User-Agent"] = []string{""}
	}

	idle := newIdleTimer(s.idleTimeout(), func() { c.Close(); up.Close() })
	defer idle.stop()
	if req.Body != nil && req.Body != http.NoBody {
		// A long upload is activity too.
		req.Body = struct {
			io.Reader
			io.Closer
		}{&activity{r: req.Body, t: idle}, req.Body}
	}
	// The request goes up while the response comes down: an upstream may
	// answer (or ask to continue) before it has read the body.
	sent := make(chan error, 1)
	go func() { sent <- req.Write(up) }()
	defer func() {
		// Ends whatever the request's writer still blocks on: a write
		// upstream, or a read of the client's body (the deadline; the
		// client connection is closed after a drain, by Serve).
		up.Close()
		c.SetReadDeadline(time.Now())
		<-sent
	}()

	lim := &headLimit{r: &activity{r: up, t: idle}}
	ubr := bufio.NewReader(lim)
	for {
		lim.n = int64(s.maxHeaderBytes())
		resp, err := http.ReadResponse(ubr, req)
		if err != nil {
			s.log().Warn("egress upstream error", append(r.attrs(), "upstream", ap.String(), "error", err.Error())...)
			writeStatus(c, http.StatusBadGateway, (&refusal{status: http.StatusBadGateway,
				msg: "the upstream's response could not be read: " + err.Error()}).body())
			return
		}
		lim.n = -1
		removeHopByHop(resp.Header)
		resp.Close = true
		resp.Trailer = nil
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			// 100 Continue and friends: pass on, then the final answer.
			if err := resp.Write(c); err != nil {
				return
			}
			continue
		}
		resp.Write(c)
		resp.Body.Close()
		return
	}
}

// checkForm checks a plain HTTP request's shape: an absolute http:// URL,
// and one Host header (hosts, as sent) naming the URL's host.
func checkForm(req *http.Request, hosts []string, r *request) *refusal {
	u := req.URL
	if u == nil || u.Host == "" || u.Scheme == "" {
		return badRequest("a proxied request names its target in absolute form (GET http://host/path); got %q", req.RequestURI)
	}
	if !strings.EqualFold(u.Scheme, "http") {
		return badRequest("only http:// URLs are proxied as plain requests (got %s://); HTTPS goes through CONNECT", u.Scheme)
	}
	r.host = strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	port := uint16(80)
	if p := u.Port(); p != "" {
		// A bad port is admit's to refuse; here it only must agree.
		port = parsePort(p)
	}
	r.port = port
	switch {
	case len(hosts) != 1:
		return refuse(ReasonHostMismatch, "the request carries %d Host headers; send exactly one, naming %s", len(hosts), u.Host)
	case !sameHost(hosts[0], r.host, port):
		return refuse(ReasonHostMismatch, "the Host header %q is not the URL's host %s; they must agree", hosts[0], u.Host)
	}
	return nil
}

func parsePort(p string) uint16 {
	ap, err := netip.ParseAddrPort("0.0.0.0:" + p)
	if err != nil {
		return 0
	}
	return ap.Port()
}

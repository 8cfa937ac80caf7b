package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestTimeFirstBytes: one sample per request, each on a new connection;
// a failing answer fails the action.
func TestTimeFirstBytes(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			http.Error(w, "no", http.StatusForbidden)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	r := timeFirstBytes(context.Background(), srv.URL+"/ok", 7, 3)
	if !r.OK || len(r.Items) != 7 {
		t.Fatalf("timing: %+v", r)
	}
	if n := conns.Load(); n != 7 {
		t.Errorf("%d connections for 7 requests, want a new one each", n)
	}
	if r := timeFirstBytes(context.Background(), srv.URL+"/fail", 2, 1); r.OK || r.Error == "" {
		t.Errorf("a 403 answer: %+v, want a failure", r)
	}
	if r := timeFirstBytes(context.Background(), srv.URL, 0, 1); r.OK {
		t.Errorf("n=0: %+v, want refused", r)
	}
}

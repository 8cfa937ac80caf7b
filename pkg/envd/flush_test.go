package envd

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	pb "github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
)

// flushCounter is a ResponseWriter that counts its flushes.
type flushCounter struct {
	http.ResponseWriter
	flushes atomic.Int32
}

func (f *flushCounter) Flush() { f.flushes.Add(1) }

// TestCoalesce: a flush asked for is done flushDelay later with what was
// written meanwhile, or left to the server if the handler returns first;
// none is done after the handler returns; gRPC's flushes (its status is in
// HTTP trailers) pass straight through.
func TestCoalesce(t *testing.T) {
	type got struct{ During, After int32 }
	cases := []struct {
		name        string
		contentType string
		handler     func(w http.ResponseWriter, waitForFlush func() int32) int32
		want        got
	}{{
		name: "flushes back to back, then the handler returns: none (the server's final write carries them)",
		handler: func(w http.ResponseWriter, _ func() int32) int32 {
			for _, m := range []string{"start", "end", "end-of-stream"} {
				_, _ = io.WriteString(w, m)
				w.(http.Flusher).Flush()
			}
			return 0
		},
		want: got{0, 0},
	}, {
		name: "a flush with the handler still running is done, once, after the delay",
		handler: func(w http.ResponseWriter, waitForFlush func() int32) int32 {
			_, _ = io.WriteString(w, "output")
			w.(http.Flusher).Flush()
			w.(http.Flusher).Flush()
			return waitForFlush()
		},
		want: got{1, 1},
	}, {
		name:        "gRPC: each flush at once",
		contentType: "application/grpc+proto",
		handler: func(w http.ResponseWriter, _ func() int32) int32 {
			w.(http.Flusher).Flush()
			w.(http.Flusher).Flush()
			return 0
		},
		want: got{0, 2},
	}, {
		name:        "gRPC-Web (status in the body): coalesced",
		contentType: "application/grpc-web+proto",
		handler: func(w http.ResponseWriter, _ func() int32) int32 {
			w.(http.Flusher).Flush()
			return 0
		},
		want: got{0, 0},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fc := &flushCounter{ResponseWriter: httptest.NewRecorder()}
			var during int32
			h := coalesce(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				during = c.handler(w, func() int32 {
					deadline := time.Now().Add(2 * time.Second)
					for fc.flushes.Load() == 0 && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
					// Nothing more is flushed for what was asked once.
					time.Sleep(5 * flushDelay)
					return fc.flushes.Load()
				})
			}))
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set("Content-Type", c.contentType)
			h.ServeHTTP(fc, r)
			time.Sleep(5 * flushDelay) // a flush after the handler returned would land here
			if diff := cmp.Diff(c.want, got{during, fc.flushes.Load()}); diff != "" {
				t.Errorf("flushes done (-want +got):\n%s", diff)
			}
		})
	}
}

// writeCounter counts the writes of the server's connections.
type writeCounter struct {
	net.Listener
	mu     sync.Mutex
	writes int
}

func (l *writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, l: l}, nil
}

func (l *writeCounter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writes
}

type countedConn struct {
	net.Conn
	l *writeCounter
}

func (c *countedConn) Write(p []byte) (int, error) {
	c.l.mu.Lock()
	c.l.writes++
	c.l.mu.Unlock()
	return c.Conn.Write(p)
}

// TestShortCommandIsOneWrite: the whole answer to a Start of a short
// command (the SDK's commands.run('true')), over HTTP/1.1 with Connect's
// JSON as the SDK sends it, leaves the agent as one write: its start and
// end events, the end of the stream and of the chunked body. Each write is
// a packet through the sandbox's network stack and the router, and a
// wake-up of the caller.
func TestShortCommandIsOneWrite(t *testing.T) {
	// Longer than a loaded machine may stall the handler between its last
	// message and its return, so that the count is the design's, not the
	// scheduler's.
	defer func(d time.Duration) { flushDelay = d }(flushDelay)
	flushDelay = 200 * time.Millisecond
	t.Setenv("HOME", t.TempDir())
	srv := serveAgent(t, access.Hash(testToken))
	wc := &writeCounter{Listener: srv.Listener}
	srv.Listener = wc
	srv.Start()
	hc := &http.Client{Transport: tokenTransport{testToken, http.DefaultTransport}}
	procs := processconnect.NewProcessClient(hc, srv.URL, connect.WithProtoJSON())
	for i := 0; i < 3; i++ {
		before := wc.count()
		stream, err := procs.Start(ctxTimeout(t, 10*time.Second), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "true"}}}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := collect[*pb.StartResponse](t, stream)
		if err != nil || res.end == nil || res.end.GetExitCode() != 0 {
			t.Fatalf("run %d: the stream ended without a successful end event: %+v, %v", i, res, err)
		}
		if got := wc.count() - before; got != 1 {
			t.Errorf("run %d: the answer left the agent in %d writes; want 1", i, got)
		}
	}
}

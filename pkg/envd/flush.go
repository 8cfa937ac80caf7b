package envd

import (
	"net/http"
	"strings"
	"sync"
	"time"
)

// flushDelay is how long a streamed message may wait for the ones behind
// it before it is sent. connect-go flushes after every message, and a
// short command's stream is several messages and the end of the stream
// within microseconds: each flush is a packet through the sandbox's
// network stack (gVisor's), the router and back, so several flushes cost
// the caller a wake-up each. Held this long, they leave as one write.
var flushDelay = time.Millisecond // a variable for the tests' sake

// coalesce makes the flushes of next's responses lazy: a flush is done
// flushDelay after it is asked for, together with whatever was written
// meanwhile, or when the handler returns (the server then writes the rest
// and the end of the response at once), whichever comes first.
func coalesce(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		// gRPC sends its status as HTTP trailers, which HTTP/1.1 can carry
		// only in a chunked body: a response never flushed before its
		// handler returns may be given a Content-Length instead, and lose
		// them. Connect and gRPC-Web (what E2B's SDK speaks) carry it in
		// the body.
		if !ok || strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") && !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc-web") {
			next.ServeHTTP(w, r)
			return
		}
		lw := &lazyFlusher{ResponseWriter: w, flusher: f}
		defer lw.finish()
		next.ServeHTTP(lw, r)
	})
}

// lazyFlusher is a ResponseWriter whose Flush is deferred. The timer's
// flush runs on another goroutine, so every use of the writer is under mu.
type lazyFlusher struct {
	http.ResponseWriter
	flusher http.Flusher

	mu      sync.Mutex
	pending *time.Timer
	done    bool // the handler returned: the writer is the server's again
}

func (l *lazyFlusher) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ResponseWriter.Write(p)
}

func (l *lazyFlusher) WriteHeader(code int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ResponseWriter.WriteHeader(code)
}

// Flush schedules a flush, unless one is scheduled already.
func (l *lazyFlusher) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil && !l.done {
		l.pending = time.AfterFunc(flushDelay, l.flushNow)
	}
}

func (l *lazyFlusher) flushNow() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = nil
	if !l.done {
		l.flusher.Flush()
	}
}

// finish ends the writer's use by the handler: no flush is done after it.
func (l *lazyFlusher) finish() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	if l.pending != nil {
		l.pending.Stop()
		l.pending = nil
	}
}

// Unwrap lets http.ResponseController reach the server's writer (connect
// enables full duplex through it for bidirectional streams).
func (l *lazyFlusher) Unwrap() http.ResponseWriter { return l.ResponseWriter }

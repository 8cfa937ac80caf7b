package kube

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// traced logs every API call at debug level with the request id of the
// operation that made it (reqid), so that a slow request's calls can be
// read in order: what it asked and how long each answer took. At info it
// costs one check per call.
type traced struct{ next http.RoundTripper }

func (t traced) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	log := reqid.Logger(ctx)
	if !log.Enabled(ctx, slog.LevelDebug) {
		return t.next.RoundTrip(req)
	}
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	code := 0
	if err == nil {
		code = resp.StatusCode
	}
	log.LogAttrs(ctx, slog.LevelDebug, "Kubernetes API call", slog.String("method", req.Method), slog.String("path", req.URL.Path),
		slog.Int("code", code), slog.Float64("ms", float64(time.Since(start).Microseconds())/1000))
	return resp, err
}

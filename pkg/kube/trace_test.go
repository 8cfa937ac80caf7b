package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// TestTracedLogsCallsAtDebug: at debug level each API call is logged once
// with the id of the request that made it, its path and its answer's code;
// at info nothing is. An httptest server stands in for the API server.
func TestTracedLogsCallsAtDebug(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) }))
	defer srv.Close()
	for _, tc := range []struct {
		name  string
		level slog.Level
		want  []map[string]any
	}{
		{"debug", slog.LevelDebug, []map[string]any{{"msg": "Kubernetes API call", "request_id": "r1", "method": "GET", "path": "/api/v1/namespaces/x/pods/p", "code": 404.0}}},
		{"info", slog.LevelInfo, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: tc.level}))
			ctx := reqid.With(context.Background(), log, "r1")
			req, err := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/namespaces/x/pods/p", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := traced{http.DefaultTransport}.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var got []map[string]any
			for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
				if len(line) == 0 {
					continue
				}
				var rec map[string]any
				if err := json.Unmarshal(line, &rec); err != nil {
					t.Fatal(err)
				}
				if _, ok := rec["ms"].(float64); !ok {
					t.Errorf("a call logged without its duration: %s", line)
				}
				delete(rec, "ms")
				delete(rec, "time")
				delete(rec, "level")
				got = append(got, rec)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("logged (-want +got):\n%s", diff)
			}
		})
	}
}

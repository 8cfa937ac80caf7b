package problem

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// TestStatusOfEveryKind pins the status each domain error kind answers
// with, on both doors (HTTP and CloudEvents write through Write).
func TestStatusOfEveryKind(t *testing.T) {
	got := map[string]int{}
	for name, err := range map[string]error{
		"internal":    &api.Error{Kind: api.KindInternal},
		"malformed":   api.Malformedf("x"),
		"invalid":     api.Invalidf("x"),
		"not found":   &api.Error{Kind: api.KindNotFound},
		"conflict":    &api.Error{Kind: api.KindConflict},
		"quota":       &api.Error{Kind: api.KindQuota},
		"unavailable": &api.Error{Kind: api.KindUnavailable},
		"timeout":     &api.Error{Kind: api.KindTimeout},
		"forbidden":   api.Forbiddenf("user_id %q belongs to another principal", "u1"),
		"foreign":     errors.New("not a domain error"),
	} {
		got[name] = Status(err)
	}
	want := map[string]int{"internal": 500, "malformed": 400, "invalid": 422, "not found": 404, "conflict": 409, "quota": 429,
		"unavailable": 503, "timeout": 504, "forbidden": 403, "foreign": 500}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

// TestForbiddenWritesItsDetail: a 403 carries the detail naming the field,
// and no Retry-After (retrying cannot help).
func TestForbiddenWritesItsDetail(t *testing.T) {
	w := httptest.NewRecorder()
	if code := Write(w, api.Forbiddenf("user_id %q belongs to another principal", "u1")); code != http.StatusForbidden {
		t.Errorf("Write answered %d, want 403", code)
	}
	if diff := cmp.Diff(`{"detail":"user_id \"u1\" belongs to another principal"}`+"\n", w.Body.String()); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if ra := w.Header().Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After %q on a 403", ra)
	}
}

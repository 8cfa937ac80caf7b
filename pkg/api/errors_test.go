package api

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestClassify pins what each failure of a call to the API server answers:
// a transient failure is never "not found" (DeerFlow deletes its record on
// 404) and never the operator's 500, and a race with another request is a
// conflict to retry.
func TestClassify(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	tests := map[string]error{
		"timeout":            apierrors.NewTimeoutError("slow", 1),
		"deadline":           context.DeadlineExceeded,
		"cancelled":          context.Canceled,
		"503":                apierrors.NewServiceUnavailable("down"),
		"500":                apierrors.NewInternalError(errors.New("boom")),
		"429":                apierrors.NewTooManyRequests("busy", 1),
		"conflict":           apierrors.NewConflict(pods, "p", errors.New("changed")),
		"already exists":     apierrors.NewAlreadyExists(pods, "p"),
		"not found":          apierrors.NewNotFound(pods, "p"),
		"forbidden":          apierrors.NewForbidden(pods, "p", errors.New("no")),
		"invalid":            apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", nil),
		"unrecognised":       errors.New("something else"),
		"already classified": &Error{Kind: KindQuota, Detail: "full"},
	}
	want := map[string]Kind{
		"timeout": KindTimeout, "deadline": KindTimeout, "cancelled": KindUnavailable,
		"503": KindUnavailable, "500": KindUnavailable, "429": KindUnavailable,
		"conflict": KindConflict, "already exists": KindConflict, "not found": KindConflict,
		"forbidden": KindInternal, "invalid": KindInvalid, "unrecognised": KindUnavailable,
		"already classified": KindQuota,
	}
	got := map[string]Kind{}
	for name, err := range tests {
		got[name] = KindOf(Classify(err, "do it"))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
}

func TestRefused(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	cases := map[string]struct {
		err  error
		want bool
	}{
		"already exists":         {apierrors.NewAlreadyExists(gr, "p"), true},
		"forbidden by admission": {apierrors.NewForbidden(gr, "p", errors.New("denied")), true},
		"invalid":                {apierrors.NewBadRequest("bad"), true},
		"too many requests":      {apierrors.NewTooManyRequests("busy", 1), true},
		"wrapped refusal":        {fmt.Errorf("create: %w", apierrors.NewConflict(gr, "p", errors.New("changed"))), true},
		"internal error":         {apierrors.NewInternalError(errors.New("boom")), false},
		"service unavailable":    {apierrors.NewServiceUnavailable("down"), false},
		"server timeout":         {apierrors.NewServerTimeout(gr, "create", 1), false},
		"client deadline":        {context.DeadlineExceeded, false},
		"client gone":            {context.Canceled, false},
		"no error":               {nil, false},
	}
	got, want := map[string]bool{}, map[string]bool{}
	for name, c := range cases {
		got[name], want[name] = Refused(c.err), c.want
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Refused (-want +got):\n%s", diff)
	}
}

package remove

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestOnErrorReturnsWhatFnReturned: OnError ends with fn's own last
// error. client-go's retry.OnError returns nil for a first call cut by
// its deadline (an error wrapping context.DeadlineExceeded, which it takes
// for the end of its backoff), so a delete the deadline cut would count as
// done: the destroy of TestSlowAPIServerEndsWithinDeadline answered 200
// without having read anything.
func TestOnErrorReturnsWhatFnReturned(t *testing.T) {
	cut := fmt.Errorf("delete pods/x: %w", context.DeadlineExceeded)
	unavailable := apierrors.NewServiceUnavailable("etcd is down")
	notFound := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "x")
	backoff := wait.Backoff{Steps: 3, Duration: 1}
	retriable := func(err error) bool { return apierrors.IsServiceUnavailable(err) }
	tests := []struct {
		name    string
		answers []error // fn's answers, call by call
		want    error
		calls   int
	}{
		{"done at once", []error{nil}, nil, 1},
		{"done after a 5xx", []error{unavailable, nil}, nil, 2},
		{"cut by its deadline at once", []error{cut}, cut, 1},
		{"a 5xx, then cut by its deadline", []error{unavailable, cut}, cut, 2},
		{"refused", []error{notFound}, notFound, 1},
		{"5xx to the last step", []error{unavailable, unavailable, unavailable}, unavailable, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := OnError(backoff, retriable, func() error {
				calls++
				return tc.answers[calls-1]
			})
			if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
				t.Errorf("OnError: %v, want %v", err, tc.want)
			}
			if diff := cmp.Diff(tc.calls, calls); diff != "" {
				t.Errorf("calls of fn (-want +got):\n%s", diff)
			}
		})
	}
}

package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/bounded"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// A paused sandbox that resumes on traffic (keys.AnnotationAutoResume,
// E2B's lifecycle.autoResume) is woken by the first request that carries
// its token: the router resumes its ReplicaSet (Waker) and holds the
// request, and every other one for the sandbox, until its next Pod is
// Ready, then forwards them as any other. A request without the token
// wakes nothing. The resume is the function's own (resources.ScalePatch:
// one Pod, the idle clock restarted); an admission policy lets the
// router's account make that change alone (config/802-admission-policy-router.yaml).

// Waker resumes a paused sandbox.
type Waker interface {
	// Wake resumes sandbox id's ReplicaSet if it is paused and resumes on
	// traffic; nil also when it is resuming or running already.
	Wake(ctx context.Context, id string) error
}

// Defaults for holding requests while a sandbox resumes.
const (
	// DefaultWakeHold bounds how long a request waits for a paused
	// sandbox's next Pod to be Ready: a cold start, with room for a slow
	// image pull.
	DefaultWakeHold = 60 * time.Second
	// DefaultMaxHeld bounds the requests held for one sandbox: past it, 429.
	DefaultMaxHeld = 64
)

// Scaler is the Waker of the router's command: it scales the ReplicaSet
// with the API server.
type Scaler struct {
	Client    kubernetes.Interface
	Namespace string
}

// Wake reads the ReplicaSet (not from a cache: a stale one would resume a
// sandbox deleted or paused anew meanwhile) and patches it, conditional on
// the version it judged; a conflict is read again, twice at most.
func (s Scaler) Wake(ctx context.Context, id string) error {
	rss := s.Client.AppsV1().ReplicaSets(s.Namespace)
	for attempt := 0; attempt < 3; attempt++ {
		rs, err := rss.Get(ctx, resources.PodName(id), metav1.GetOptions{})
		switch {
		case err != nil:
			return fmt.Errorf("reading sandbox %s's ReplicaSet: %w", id, err)
		case rs.DeletionTimestamp != nil || !resources.IsSandbox(rs, id):
			return fmt.Errorf("sandbox %s is being deleted: %w", id, ErrNotFound)
		case !resources.Paused(rs):
			return nil // resumed by another request, replica or the function
		case rs.Annotations[keys.AnnotationAutoResume] != "true":
			return fmt.Errorf("sandbox %s does not resume on traffic", id)
		}
		_, err = rss.Patch(ctx, rs.Name, types.MergePatchType, resources.ScalePatch(rs, 1, true, time.Now()), metav1.PatchOptions{})
		switch {
		case err == nil:
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("resuming sandbox %s: %w", id, err)
		}
	}
	return fmt.Errorf("sandbox %s changed while being resumed; retry", id)
}

// wakes starts one resume per sandbox however many requests ask, and
// bounds the requests held for each.
type wakes struct {
	group singleflight.Group
	held  bounded.Counts
}

// errTooManyHeld: the sandbox already holds its bound of requests.
var errTooManyHeld = errors.New("too many requests are waiting for this sandbox to resume")

// hold counts a request held for id, or refuses past max; release undoes it.
func (w *wakes) hold(id string, max int) (release func(), err error) {
	release, ok := w.held.Take(id, max)
	if !ok {
		return nil, errTooManyHeld
	}
	return release, nil
}

// wake resumes id once for all the requests that ask at the same time,
// under a deadline of its own: the request that started it may leave.
func (w *wakes) wake(waker Waker, id string, bound time.Duration) error {
	_, err, _ := w.group.Do(id, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		return nil, waker.Wake(ctx, id)
	})
	return err
}

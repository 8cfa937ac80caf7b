//go:build e2e

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// ownRecreate is the bench's own row of a create right after a delete of
// the same id.
const ownRecreate = "create → Ready, the id just deleted (real node)"

// recreateToReady measures what the rows of fresh ids never see (issue 33):
// a create of an id whose sandbox was deleted a moment before, as the
// curl lines `make run` prints do (one id: create, get, delete, and again)
// and as DeerFlow does (its sandbox id is a function of the thread). The
// old Pod is still terminating, and a Pod's name is its sandbox's, so the
// create waits until the kubelet has torn the old one down (waitGone):
// about two seconds on the real node. Ours: DELETE /api/sandboxes/{id},
// then the timed POST …?wait=20s. The floor: client-go deletes the same
// Service and Pod, and the timed part watches the Pod until it is gone,
// then creates both and watches the new Pod until Ready.
func recreateToReady(b *testing.B, kc *cluster.Cluster, fn *function.Instance, fl floor, floorReady, oursReady func(string) error, n int) (ours, floorDs []time.Duration) {
	b.Helper()
	ctx := context.Background()
	gone := func(id string) error {
		return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := kc.Client.CoreV1().Pods(ns).Get(ctx, resources.PodName(id), metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}
	floorRecreate := func(id string) error {
		if err := gone(id); err != nil {
			return fmt.Errorf("the old Pod of %s did not go: %w", id, err)
		}
		return floorReady(id)
	}
	oursDelete := func(id string) error {
		r, err := fn.Do("DELETE", "/api/sandboxes/"+id, nil)
		if err != nil {
			return err
		}
		if r.Code != 200 {
			return fmt.Errorf("delete %s: %d %s", id, r.Code, r.Raw)
		}
		return nil
	}
	progress("real node: %d creates → Ready of an id deleted a moment before, the floor and ours alternating round by round", n)
	type side struct {
		id     string
		create func(string) error
		del    func(string) error
		timed  func(string) error
		out    *[]time.Duration
	}
	sides := []side{
		{"xf", floorReady, func(id string) error { return fl.delete(ctx, id) }, floorRecreate, &floorDs},
		{"xo", oursReady, oursDelete, oursReady, &ours},
	}
	for _, s := range sides {
		if err := s.create(s.id); err != nil {
			b.Fatal(err)
		}
	}
	// Round by round, each side once, the one to go first swapped every
	// round: both see the API server and the node as they drift, and
	// neither always follows the other's teardown. The other side's
	// sandbox stands idle meanwhile, for both alike.
	for i := 0; i < n; i++ {
		for j := range sides {
			s := sides[(i+j)%len(sides)]
			if err := s.del(s.id); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := s.timed(s.id); err != nil {
				b.Fatal(err)
			}
			*s.out = append(*s.out, time.Since(start))
		}
	}
	for _, s := range sides {
		_ = s.del(s.id)
	}
	ownRows[ownRecreate] = pct(ours, .5)
	return ours, floorDs
}

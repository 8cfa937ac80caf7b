// Package slot keeps a cold create's slots. Slot, leftover and the order a
// create writes in (slot, quota count, workload, bind) are defined in
// docs/architecture.md; quota.Counter.Check says why the order holds the
// limit.
//
// The rule this package keeps: a slot has one writer, the create that made
// it. Only that create writes a workload under it, and only that create
// removes it before it is a leftover (Slots.Leftover). Anyone else who
// meets a slot waits for it (Slots.Await); a leftover's create is gone, and
// the next create of its id takes it over. Were two writers to share one,
// either could remove it while the other's workload stood, or was about to
// be written: a workload the quota did not count.
package slot

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Slots acts on the slots of one namespace.
type Slots struct {
	Client    kubernetes.Interface
	Namespace string
	Remover   *remove.Remover // the Manager's, whose Lands tests shorten
	// UndoTimeout bounds the removal of a slot once its request has ended
	// (REQUEST_TIMEOUT).
	UndoTimeout time.Duration
}

// WriteWithin is how long after starting its slot's create a create may
// still send the write of the slot's workload (normally milliseconds: its
// quota count and one create). One that cannot send it in time gives its
// slot up and starts over with a new one. It is what lets anyone else tell
// a slot whose create is gone (its replica killed, its undo failed) from
// one still being filled, soon enough for a retry of the create to take
// the id over within its own deadline.
const WriteWithin = 3 * time.Second

// clockSlack covers a creationTimestamp's truncation to the second (a
// slot looks up to a second older than it is) and the clocks of two
// replicas apart.
const clockSlack = 2 * time.Second

// Leftover reports whether svc is a slot that no create will write under
// or bind any more: one owned by nothing and older than WriteWithin, plus
// the time its create's last write may take to land
// (remove.Remover.AwaitLanding), plus clockSlack. A Service owned by
// nothing may also own its workload (resources.OwnedBy): a whole sandbox,
// which its callers rule out first by reading that workload.
func (s Slots) Leftover(svc *corev1.Service) bool {
	return resources.SandboxOwner(svc.OwnerReferences) == nil && resources.SelectedToken(svc) != "" &&
		time.Since(svc.CreationTimestamp.Time) > WriteWithin+s.Remover.Landing()+clockSlack
}

// Settles bounds a wait for another request's slot to be bound or given
// up: the request's own deadline, less a moment to answer in.
func (s Slots) Settles(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d)-500*time.Millisecond, 0)
	}
	return s.UndoTimeout
}

// Await waits, within Settles, until the create that made svc (a slot of
// sandbox id) has bound it (or written the Pod it owns), given it up, or
// left it (Leftover), and reports whether it did. The API server's 5xx
// only means another read.
func (s Slots) Await(ctx context.Context, svc *corev1.Service, id string) bool {
	svcs := s.Client.CoreV1().Services(s.Namespace)
	owns := func(ctx context.Context, cur *corev1.Service) bool {
		if resources.SlotKind(cur) != "Pod" {
			return false // a ReplicaSet is bound by an update of its slot
		}
		pod, err := s.Client.CoreV1().Pods(s.Namespace).Get(ctx, resources.PodName(id), metav1.GetOptions{})
		return err == nil && pod.DeletionTimestamp == nil && resources.OwnedBy(pod, cur)
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, s.Settles(ctx), false, func(ctx context.Context) (bool, error) {
		cur, err := svcs.Get(ctx, svc.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, nil
		}
		return cur.UID != svc.UID || cur.DeletionTimestamp != nil || !resources.Pending(cur, id) || s.Leftover(cur) || owns(ctx, cur), nil
	})
	return err == nil
}

// Drop removes svc, a slot its caller made, under a deadline of its own
// (the request's may be what ended it), as it was made (UID and
// resourceVersion), retrying the API server's 5xx. What it cannot remove it
// returns: that slot counts for the quota until the next create, destroy
// or reap of its id removes it.
func (s Slots) Drop(ctx context.Context, svc *corev1.Service) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.UndoTimeout)
	defer cancel()
	return s.Remover.Service(uctx, svc, true)
}

// UndoCut follows a slot create (of want) that failed with err without
// saying whether it was written (remove.Remover.UndoCut's twin): the
// Service is read back, and again once a cut write must have landed when
// it is not there yet (remove.Remover.AwaitLanding), and dropped when it
// carries want's token. A refusal (a 4xx) wrote nothing. A slot that lands
// later still, or that cannot be dropped (the error returned), counts for
// the quota until the next create, destroy or reap of its id removes it.
func (s Slots) UndoCut(ctx context.Context, err error, want *corev1.Service) error {
	if api.Refused(err) {
		return nil
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.UndoTimeout)
	defer cancel()
	var got *corev1.Service
	read := func() (err error) {
		got, err = s.Client.CoreV1().Services(s.Namespace).Get(uctx, want.Name, metav1.GetOptions{})
		return err
	}
	rerr := remove.Retry(uctx, read)
	if apierrors.IsNotFound(rerr) && s.Remover.AwaitLanding(uctx) == nil {
		rerr = remove.Retry(uctx, read)
	}
	if rerr != nil || got.DeletionTimestamp != nil || resources.SandboxOwner(got.OwnerReferences) != nil || resources.SelectedToken(got) != resources.SelectedToken(want) {
		return nil
	}
	return s.Drop(ctx, got)
}

// Package envsecret writes the Secret that holds a create's env values
// (issue 45 finding 8): the sandbox's own, sandbox-<id>-env, owned by its
// Service (resources.EnvSecret builds it), written before the workload that
// takes each variable from it by reference. pkg/sandbox's create calls it
// once it holds the id's slot; removing one is pkg/remove's.
package envsecret

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sleep"
)

// maxAttempts bounds the rounds spent replacing a stale Secret of the name.
const maxAttempts = 5

// Secrets writes env Secrets in one namespace.
type Secrets struct {
	Client    kubernetes.Interface
	Namespace string
}

// Ensure writes want, the env Secret of sandbox id owned by svc (the
// create's own slot), before the workload that references it: a container
// whose Secret is missing does not start until the kubelet's next try.
// failed explains a create the API server refused (an admission policy, a
// missing namespace) in the caller's terms.
//
// The slot is the id's lock, so no other create of the id writes a Secret
// while this one holds it. A Secret of the name that is already there is
// this create's own (a write cut after it landed: owned by svc's UID), or
// one left by a sandbox of the id whose Service is gone, which the garbage
// collector has not removed yet: that one goes (with its UID as
// precondition) and this create writes its own. A Secret of the name that
// is not a sandbox's is never touched: 409.
func (e Secrets) Ensure(ctx context.Context, want *corev1.Secret, id string, svc *corev1.Service, failed func(error) error) (*corev1.Secret, error) {
	secrets := e.Client.CoreV1().Secrets(e.Namespace)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		created, err := secrets.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, failed(err)
		}
		existing, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, api.Classify(err, "read the existing env Secret of the sandbox")
		case !resources.IsEnvSecret(existing, id):
			return nil, &api.Error{Kind: api.KindConflict, Detail: "a Secret named " + existing.Name + " exists and is not a sandbox's; choose another sandbox_id"}
		case resources.EnvSecretOwnedBy(existing, svc.UID) && existing.DeletionTimestamp == nil:
			return existing, nil
		}
		// Of a Service gone (this create holds the id's Service): stale.
		err = secrets.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(existing.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return nil, api.Classify(err, "replace a stale env Secret of the sandbox")
		}
		if err := sleep.For(ctx, time.Duration(attempt)*50*time.Millisecond); err != nil {
			return nil, api.Classify(err, "replace a stale env Secret of the sandbox")
		}
	}
	return nil, &api.Error{Kind: api.KindConflict, Detail: "the env Secret of sandbox " + id + " is changing concurrently; retry"}
}

// Package envsecret writes the Secret that holds a create's env values:
// the sandbox's own, sandbox-<id>-env, owned by its
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
// The function never reads a Secret back: its Role grants create and
// delete, no get, so neither a bug nor a stolen token of the function
// reads a tenant's values or the API keys. The slot is the id's lock, so
// no other create of the id writes a Secret while this one holds it, and
// no live sandbox of the id owns one: a Secret of the name that is already
// there is this create's own (a write cut after it landed) or one left by
// a sandbox of the id whose Service is gone, which the garbage collector
// has not removed yet. Either goes, by name, and this create writes its
// own. A Secret of the name that is not a sandbox's env Secret is the
// admission policy's to keep (config/800-admission-policy.yaml admits the
// delete of a sandbox's env Secret alone): its refusal is a 409, and the
// Secret is left as it was.
func (e Secrets) Ensure(ctx context.Context, want *corev1.Secret, id string, failed func(error) error) (*corev1.Secret, error) {
	secrets := e.Client.CoreV1().Secrets(e.Namespace)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		created, err := secrets.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, failed(err)
		}
		err = secrets.Delete(ctx, want.Name, metav1.DeleteOptions{})
		switch {
		case err == nil || apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
			return nil, &api.Error{Kind: api.KindConflict, Detail: "a Secret named " + want.Name + " exists and is not a sandbox's env Secret; choose another sandbox_id"}
		default:
			return nil, api.Classify(err, "replace a stale env Secret of the sandbox")
		}
		if err := sleep.For(ctx, time.Duration(attempt)*50*time.Millisecond); err != nil {
			return nil, api.Classify(err, "replace a stale env Secret of the sandbox")
		}
	}
	return nil, &api.Error{Kind: api.KindConflict, Detail: "the env Secret of sandbox " + id + " is changing concurrently; retry"}
}

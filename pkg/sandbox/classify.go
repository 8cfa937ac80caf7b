package sandbox

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// classify turns an error from the API server into a domain error. Its main
// job is the rule DeerFlow depends on: a transient failure must never look
// like "not found", or the backend throws away a healthy sandbox.
func classify(err error, action string) error {
	if err == nil {
		return nil
	}
	var de *api.Error
	if errors.As(err, &de) {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		return api.Errorf(api.KindTimeout, err, "the Kubernetes API server did not answer in time while trying to %s; retry", action)
	case errors.Is(err, context.Canceled):
		return api.Errorf(api.KindUnavailable, err, "the request was cancelled while trying to %s", action)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "error looking up service account"):
		// A namespace seconds old has no default ServiceAccount yet.
		return api.Errorf(api.KindUnavailable, err, "the namespace's ServiceAccount does not exist yet, so the API server refused to %s; retry", action)
	case apierrors.IsForbidden(err):
		return api.Errorf(api.KindInternal, err, "the provisioner's ServiceAccount is not allowed to %s; check its Role", action)
	case apierrors.IsInvalid(err):
		return api.Errorf(api.KindInvalid, err, "the Kubernetes API server rejected the objects built to %s: %s", action, apierrors.ReasonForError(err))
	case apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err):
		return api.Errorf(api.KindUnavailable, err, "the Kubernetes API server is overloaded or unavailable while trying to %s; retry", action)
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return api.Errorf(api.KindUnavailable, err, "the Kubernetes API server is unreachable while trying to %s; retry", action)
	}
	if _, ok := err.(apierrors.APIStatus); ok {
		return api.Errorf(api.KindInternal, err, "the Kubernetes API server refused to %s", action)
	}
	// Anything we cannot recognise is treated as transient: retrying a 503 is
	// harmless, mistaking an outage for "gone" is not.
	return api.Errorf(api.KindUnavailable, err, "could not %s", action)
}

// Package api is the provisioner's contract with its callers: the DeerFlow
// wire types (create request, sandbox, list, destroy and reap bodies), their
// validation and defaults, the domain error kinds the doors map to HTTP
// statuses, the Caller an operation runs for, and the Operations both doors
// call. It knows nothing of Kubernetes clients or HTTP.
package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Kind classifies a domain error. The front doors map kinds to HTTP statuses;
// nothing below them knows about status codes.
type Kind int

const (
	// KindInternal is a fault on our side or a misconfiguration (RBAC, missing namespace).
	KindInternal Kind = iota
	// KindMalformed is a request that cannot be parsed at all.
	KindMalformed
	// KindInvalid is a well-formed request that can never succeed as sent.
	KindInvalid
	// KindNotFound is an absent sandbox.
	KindNotFound
	// KindConflict is a sandbox in a state that forbids the request right now.
	KindConflict
	// KindQuota is a refusal by a configured limit.
	KindQuota
	// KindUnavailable is a transient failure of the API server: retry later.
	KindUnavailable
	// KindTimeout is a deadline that ran out before the API server answered.
	KindTimeout
	// KindForbidden is a request the caller's principal may not make as
	// sent, such as naming another principal's user_id or thread_id. It is
	// not an authentication failure: the doors answer those themselves.
	KindForbidden
)

// Error is the one error type the domain returns.
type Error struct {
	Kind   Kind
	Detail string // a sentence a person can act on
	Err    error  // the cause, for logs
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Detail + ": " + e.Err.Error()
	}
	return e.Detail
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds a domain error of kind with its cause (nil: none).
func Errorf(kind Kind, cause error, format string, args ...any) *Error {
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...), Err: cause}
}

// Invalidf builds a KindInvalid error.
func Invalidf(format string, args ...any) *Error { return Errorf(KindInvalid, nil, format, args...) }

// Forbiddenf builds a KindForbidden error.
func Forbiddenf(format string, args ...any) *Error {
	return Errorf(KindForbidden, nil, format, args...)
}

// Malformedf builds a KindMalformed error.
func Malformedf(format string, args ...any) *Error {
	return Errorf(KindMalformed, nil, format, args...)
}

// KindOf returns the kind of err, KindInternal for foreign errors.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// DetailOf returns the human-readable detail of err.
func DetailOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Detail
	}
	return "internal error"
}

// Refused reports whether err is the API server's refusal of a write (a
// 4xx status): the write did not happen. Anything else (a 5xx, a timeout,
// the client gone) may have been written before it failed, and is read back.
func Refused(err error) bool {
	var st apierrors.APIStatus
	return errors.As(err, &st) && st.Status().Code >= 400 && st.Status().Code < 500
}

// Classify turns an error from the API server into a domain error. Its main
// job is the rule DeerFlow depends on: a transient failure must never look
// like "not found", or the backend throws away a healthy sandbox.
func Classify(err error, action string) error {
	if err == nil {
		return nil
	}
	var de *Error
	if errors.As(err, &de) {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		return Errorf(KindTimeout, err, "the Kubernetes API server did not answer in time while trying to %s; retry", action)
	case errors.Is(err, context.Canceled):
		return Errorf(KindUnavailable, err, "the request was cancelled while trying to %s", action)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "error looking up service account"):
		// A namespace seconds old has no default ServiceAccount yet.
		return Errorf(KindUnavailable, err, "the namespace's ServiceAccount does not exist yet, so the API server refused to %s; retry", action)
	case apierrors.IsForbidden(err):
		return Errorf(KindInternal, err, "the provisioner's ServiceAccount is not allowed to %s; check its Role", action)
	case apierrors.IsInvalid(err):
		return Errorf(KindInvalid, err, "the Kubernetes API server rejected the objects built to %s: %s", action, apierrors.ReasonForError(err))
	case apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err):
		return Errorf(KindUnavailable, err, "the Kubernetes API server is overloaded or unavailable while trying to %s; retry", action)
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err):
		// An object changed, appeared or went between a read and a write:
		// another request acted on the sandbox meanwhile. Never a 404 (the
		// caller's sandbox may well exist) and never the operator's 500.
		return Errorf(KindConflict, err, "the sandbox changed while trying to %s; retry", action)
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return Errorf(KindUnavailable, err, "the Kubernetes API server is unreachable while trying to %s; retry", action)
	}
	if _, ok := err.(apierrors.APIStatus); ok {
		return Errorf(KindInternal, err, "the Kubernetes API server refused to %s", action)
	}
	// Anything we cannot recognise is treated as transient: retrying a 503 is
	// harmless, mistaking an outage for "gone" is not.
	return Errorf(KindUnavailable, err, "could not %s", action)
}

// UIDChanged reports whether err is the API server's refusal of a patch
// whose metadata.uid is not the object's: the object was deleted and
// created again under its name. It answers 422 (the UID is immutable), not
// 409, so it is told apart by the field it names.
func UIDChanged(err error) bool {
	if !apierrors.IsInvalid(err) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == "metadata.uid" {
			return true
		}
	}
	return false
}

// Outcome names err for an audit trail: "ok" for none, otherwise its
// kind, in snake case.
func Outcome(err error) string {
	if err == nil {
		return "ok"
	}
	switch KindOf(err) {
	case KindMalformed:
		return "malformed"
	case KindInvalid:
		return "invalid"
	case KindForbidden:
		return "forbidden"
	case KindNotFound:
		return "not_found"
	case KindConflict:
		return "conflict"
	case KindQuota:
		return "over_quota"
	case KindUnavailable:
		return "unavailable"
	case KindTimeout:
		return "timeout"
	}
	return "internal"
}

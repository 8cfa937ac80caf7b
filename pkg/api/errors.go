// Package api is the provisioner's contract with its callers: the DeerFlow
// wire types (create request, sandbox, list, destroy and reap bodies), their
// validation and defaults, the domain error kinds the doors map to HTTP
// statuses, the Caller an operation runs for, and the Operations both doors
// call. It knows nothing of Kubernetes clients or HTTP.
package api

import (
	"errors"
	"fmt"
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

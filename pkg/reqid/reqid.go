// Package reqid carries a request id and a logger that includes it through a
// request's context, for both front doors.
package reqid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"regexp"
)

type ctxKey struct{}

// value keeps the logger without the id too, so that Rebind can replace the
// id rather than log a second one beside it.
type value struct {
	base, logger *slog.Logger
	id           string
}

// Header is where clients may send their own request id.
const Header = "X-Request-Id"

var safeID = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// Sanitize returns id if it is safe to log and echo, or a fresh id.
func Sanitize(id string) string {
	if safeID.MatchString(id) {
		return id
	}
	return New()
}

// New returns a random request id.
func New() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// With returns ctx carrying a logger that adds id to every record.
func With(ctx context.Context, base *slog.Logger, id string) context.Context {
	return context.WithValue(ctx, ctxKey{}, value{base: base, logger: base.With("request_id", id), id: id})
}

// Rebind gives the request in ctx a new id: a CloudEvent's own id replaces
// the one its HTTP delivery got.
func Rebind(ctx context.Context, id string) context.Context {
	base := slog.Default()
	if v, ok := ctx.Value(ctxKey{}).(value); ok {
		base = v.base
	}
	return With(ctx, base, id)
}

// Logger returns the request's logger, or slog's default.
func Logger(ctx context.Context) *slog.Logger {
	if v, ok := ctx.Value(ctxKey{}).(value); ok {
		return v.logger
	}
	return slog.Default()
}

// ID returns the request's id, or "" outside a request.
func ID(ctx context.Context) string {
	v, _ := ctx.Value(ctxKey{}).(value)
	return v.id
}

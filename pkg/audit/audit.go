// Package audit writes the audit trail: one line per mutating operation on
// a sandbox (create, destroy, pause, resume, reap) with the principal, the
// operation, the sandbox id and the outcome, on a logger of its own so that
// LOG_LEVEL cannot silence it.
package audit

import (
	"context"
	"log/slog"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// Outcomes of an audited operation besides the error kinds (api.Outcome).
const (
	OK = "ok"
	// Absent: a destroy found nothing of the caller's (answered 200 as for
	// an id that never existed).
	Absent = "absent"
	// Hidden: the id is another principal's sandbox, answered as absent
	// and left alone.
	Hidden = "hidden"
)

// Log is the audit trail; the zero value writes to slog.Default().
type Log struct{ Logger *slog.Logger }

func (l Log) logger() *slog.Logger {
	if l.Logger == nil {
		return slog.Default()
	}
	return l.Logger
}

// Record writes one audit line: the caller of ctx did operation on id with
// outcome; err, when set, adds its detail.
func (l Log) Record(ctx context.Context, operation, id, outcome string, err error, attrs ...slog.Attr) {
	c, _ := api.CallerFrom(ctx)
	all := append([]slog.Attr{
		slog.String("audit", "sandbox"),
		slog.String("principal", c.Principal),
		slog.Bool("admin", c.Admin),
		slog.String("operation", operation),
		slog.String("sandbox_id", id),
		slog.String("outcome", outcome),
		slog.String("request_id", reqid.ID(ctx)),
	}, attrs...)
	if err != nil {
		all = append(all, slog.String("detail", api.DetailOf(err)))
	}
	l.logger().LogAttrs(ctx, slog.LevelInfo, "audit", all...)
}

// Leftover warns that a failed create could not remove what it wrote (or
// may have written) of sandbox id.
func (l Log) Leftover(ctx context.Context, id string, err error) {
	l.logger().LogAttrs(ctx, slog.LevelWarn, "a failed create could not remove what it wrote; the next create, destroy or reap of its id will",
		slog.String("sandbox_id", id), slog.String("request_id", reqid.ID(ctx)), slog.String("error", err.Error()))
}

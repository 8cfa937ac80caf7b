package sandbox

import (
	"context"
	"log/slog"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// WithAuditLog sends the audit trail to l: one line per mutating operation
// (create, destroy, pause, resume, reap) with the principal, the operation,
// the sandbox id and the outcome. It is its own logger so that LOG_LEVEL
// cannot silence it.
func WithAuditLog(l *slog.Logger) Option { return func(m *Manager) { m.auditLog = l } }

// Outcomes of an audited operation besides the error kinds.
const (
	outcomeOK = "ok"
	// outcomeAbsent: a destroy found nothing of the caller's (answered 200
	// as for an id that never existed).
	outcomeAbsent = "absent"
	// outcomeHidden: the id is another principal's sandbox, answered as
	// absent and left alone.
	outcomeHidden = "hidden"
)

// audit writes one audit line. result is the outcome; err, when set, adds
// its detail.
func (m *Manager) audit(ctx context.Context, operation, id, result string, err error, attrs ...slog.Attr) {
	c, _ := api.CallerFrom(ctx)
	all := append([]slog.Attr{
		slog.String("audit", "sandbox"),
		slog.String("principal", c.Principal),
		slog.Bool("admin", c.Admin),
		slog.String("operation", operation),
		slog.String("sandbox_id", id),
		slog.String("outcome", result),
		slog.String("request_id", reqid.ID(ctx)),
	}, attrs...)
	if err != nil {
		all = append(all, slog.String("detail", api.DetailOf(err)))
	}
	m.auditLog.LogAttrs(ctx, slog.LevelInfo, "audit", all...)
}

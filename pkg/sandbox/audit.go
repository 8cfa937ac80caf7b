package sandbox

import (
	"log/slog"

	"github.com/deerflow-sandbox/provisioner/pkg/audit"
)

// WithAuditLog sends the audit trail (package audit) to l.
func WithAuditLog(l *slog.Logger) Option { return func(m *Manager) { m.audit = audit.Log{Logger: l} } }

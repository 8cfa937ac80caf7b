package api

import (
	"context"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// Operations is what the front doors (HTTP and CloudEvents) call: one domain
// call per operation, so the two cannot drift apart.
type Operations interface {
	Create(ctx context.Context, s Spec, wait time.Duration) (Sandbox, error)
	Get(ctx context.Context, id string, wait time.Duration) (Sandbox, error)
	List(ctx context.Context) ([]Sandbox, error)
	Destroy(ctx context.Context, id string) error
	Reap(ctx context.Context) (Reaped, error)
	Pause(ctx context.Context, id string) (Sandbox, error)
	Resume(ctx context.Context, id string, wait time.Duration) (Sandbox, error)
	Templates(ctx context.Context) ([]template.Summary, error)
	// Egress grants or revokes names on one allowlist sandbox's egress list.
	Egress(ctx context.Context, id string, c EgressChange) (Sandbox, error)
}

// ListResponse is DeerFlow's list body.
type ListResponse struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	Count     int       `json:"count"`
}

// DestroyResponse is DeerFlow's delete body.
type DestroyResponse struct {
	OK        bool   `json:"ok"`
	SandboxID string `json:"sandbox_id"`
}

// TemplatesResponse is the body of GET /api/templates.
type TemplatesResponse struct {
	Templates []template.Summary `json:"templates"`
	Count     int                `json:"count"`
}

// Reaped says what one reap removed.
type Reaped struct {
	Removed []ReapedSandbox `json:"removed"`
	Count   int             `json:"count"`
	// Paused lists the idle sandboxes paused instead of removed (templates
	// with idle-action pause).
	Paused []ReapedSandbox `json:"paused,omitempty"`
}

// ReapedSandbox is one removed sandbox and why.
type ReapedSandbox struct {
	ID     string `json:"sandbox_id"`
	Reason string `json:"reason"` // idle, lifetime, ended, paused-timeout, orphaned-service
}

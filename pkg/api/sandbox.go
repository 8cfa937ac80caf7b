package api

import "github.com/deerflow-sandbox/provisioner/pkg/egress"

// Sandbox is what the provisioner reports about one sandbox. The first three
// fields are DeerFlow's SandboxResponse; the rest are extra, which DeerFlow ignores.
type Sandbox struct {
	ID               string   `json:"sandbox_id"`
	URL              string   `json:"sandbox_url"`
	Status           string   `json:"status"`
	MaxShellSessions *int     `json:"max_shell_sessions,omitempty"`
	Ready            bool     `json:"ready"`
	ExpiresAt        string   `json:"expires_at,omitempty"`
	Missing          []string `json:"missing,omitempty"`
	// WaitTimedOut and Reason are set when a caller asked to wait for
	// readiness and the wait ended first; Reason says what the Pod is stuck on.
	WaitTimedOut bool   `json:"wait_timed_out,omitempty"`
	Reason       string `json:"reason,omitempty"`
	// Pooled says that the sandbox's Pod was claimed from a warm pool.
	Pooled bool `json:"pooled,omitempty"`
	// Egress is what the sandbox may reach outside the cluster.
	Egress *EgressView `json:"egress,omitempty"`

	// Known to the doors, not on DeerFlow's wire: the E2B API answers them
	// (its template, start and metadata), and makes the sandbox's access
	// tokens from the principal and creation time the workload records.
	Template  string            `json:"-"`
	CreatedAt string            `json:"-"`
	Principal string            `json:"-"`
	Metadata  map[string]string `json:"-"`
	// Envd says the sandbox carries the envd-compatible agent.
	Envd bool `json:"-"`
	// Pauses says that the sandbox pauses when its time is up (a ReplicaSet
	// with idle-action pause) rather than being deleted.
	Pauses bool `json:"-"`
}

// EgressView is a sandbox's egress as get and list show it: its mode, and,
// in allowlist mode, its list (the template's) and the grants made since,
// live ones only.
type EgressView struct {
	Mode   egress.Mode    `json:"mode"`
	Allow  []string       `json:"allow"`
	Grants []egress.Grant `json:"grants,omitempty"`
}

// StatusNotFound is DeerFlow's status for a sandbox whose Pod is gone.
const StatusNotFound = "NotFound"

// StatusPaused is the status of a sandbox scaled to zero: no Pod, its
// Service (and so its URL) and its data kept.
const StatusPaused = "Paused"

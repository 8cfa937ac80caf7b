// Package grant records egress grants: names added to, or removed from, one
// allowlist sandbox's egress list at run time, for a while or for its
// lifetime (package egress says what they mean). A grant is written on the
// sandbox's Service, which the egress proxy watches, so the next connection
// is judged by it.
package grant

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/audit"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Sandboxes finds a sandbox as its caller may see it: another principal's
// is not found (sandbox.Manager.Get).
type Sandboxes interface {
	Get(ctx context.Context, id string, wait time.Duration) (api.Sandbox, error)
}

// Counter counts grants and revokes by outcome (metrics.Metrics).
type Counter interface{ EgressChanged(op, outcome string) }

// Granter changes sandboxes' grants.
type Granter struct {
	cfg       *config.Config
	client    kubernetes.Interface
	sandboxes Sandboxes
	audit     audit.Log
	count     Counter
	now       func() time.Time
}

// New returns a Granter that finds sandboxes through sandboxes and writes
// through client.
func New(cfg *config.Config, client kubernetes.Interface, sandboxes Sandboxes, auditLog *slog.Logger, count Counter) *Granter {
	return &Granter{cfg: cfg, client: client, sandboxes: sandboxes, audit: audit.Log{Logger: auditLog}, count: count, now: time.Now}
}

// Egress grants names to one allowlist sandbox's egress, or revokes them.
// The sandbox's own principal alone may: another gets 404, as for every
// operation on a sandbox (and it counts as the sandbox's activity, as a
// get does). A grant never widens another sandbox's list, and never turns
// a mode into another: an open or isolated sandbox is refused (409).
func (g *Granter) Egress(ctx context.Context, id string, c api.EgressChange) (api.Sandbox, error) {
	sb, err := g.egress(ctx, id, c)
	op := "egress-grant"
	if c.Revoke {
		op = "egress-revoke"
	}
	g.audit.Record(ctx, op, id, api.Outcome(err), err, slog.String("names", strings.Join(c.Allow, ",")), slog.Duration("for", c.For))
	if g.count != nil {
		g.count.EgressChanged(op, api.Outcome(err))
	}
	return sb, err
}

func (g *Granter) egress(ctx context.Context, id string, c api.EgressChange) (api.Sandbox, error) {
	sb, err := g.sandboxes.Get(ctx, id, 0)
	if err != nil {
		return api.Sandbox{}, err
	}
	if sb.Egress == nil || sb.Egress.Mode != egress.Allowlist {
		mode := egress.Open
		if sb.Egress != nil {
			mode = sb.Egress.Mode
		}
		return api.Sandbox{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " is in " + string(mode) +
			" egress mode; names are granted to allowlist sandboxes only, and a grant does not change a sandbox's mode (create it from a template with sandbox.deerflow.dev/egress: allowlist)"}
	}
	now := g.now()
	var until *time.Time
	if c.For > 0 {
		u := now.Add(c.For).UTC().Truncate(time.Second)
		until = &u
	}
	svcs := g.client.CoreV1().Services(g.cfg.Namespace)
	var svc *corev1.Service
	// The resourceVersion makes each patch conditional: two grants at once
	// each apply to what the other wrote (the loser reads and tries again).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if svc, err = svcs.Get(ctx, resources.ServiceName(id), metav1.GetOptions{}); err != nil {
			return err
		}
		if svc.Labels[keys.LabelID] != id {
			return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " has no Service of its own, which holds its egress list; create it again"}
		}
		old, err := egress.DecodeGrants(svc.Annotations[keys.AnnotationEgressGrants])
		if err != nil {
			old = nil // unreadable: the proxy refuses by it too; this write replaces it
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": svc.ResourceVersion,
			"annotations":     map[string]any{keys.AnnotationEgressGrants: nullIfEmpty(egress.EncodeGrants(egress.ApplyGrants(old, c.Allow, until, c.Revoke, now)))},
		}})
		svc, err = svcs.Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return api.Sandbox{}, api.Classify(err, "record the egress grants of sandbox "+id)
	}
	sb.Egress = resources.EgressView(g.cfg.Objects(), nil, svc, now)
	return sb, nil
}

// nullIfEmpty removes an annotation in a merge patch when there is nothing
// left to record.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

package sandbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// Egress grants names to one allowlist sandbox's egress for a while or its
// lifetime, or revokes them. The sandbox's own principal alone may (another
// gets 404, as for every operation on a sandbox). The grants are recorded on
// the sandbox's Service, which the egress proxy watches: the next
// connection is judged by them. A grant never widens another sandbox's
// list, and never turns a mode into another: an open or isolated sandbox is
// refused (409).
func (m *Manager) Egress(ctx context.Context, id string, c api.EgressChange) (api.Sandbox, error) {
	sb, err := m.egress(ctx, id, c)
	op := "egress-grant"
	if c.Revoke {
		op = "egress-revoke"
	}
	m.audit.Record(ctx, op, id, api.Outcome(err), err, slog.String("names", strings.Join(c.Allow, ",")), slog.Duration("for", c.For))
	m.observer.EgressChanged(op, api.Outcome(err))
	return sb, err
}

func (m *Manager) egress(ctx context.Context, id string, c api.EgressChange) (api.Sandbox, error) {
	f, release, err := m.lookup(ctx, id, 0)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	if f.svc == nil {
		return api.Sandbox{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " has no Service, which holds its egress list; create it again"}
	}
	if v := m.view(id, f).Egress; v.Mode != egress.Allowlist {
		return api.Sandbox{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " is in " + string(v.Mode) +
			" egress mode; names are granted to allowlist sandboxes only, and a grant does not change a sandbox's mode (create it from a template with sandbox.deerflow.dev/egress: allowlist)"}
	}
	now := time.Now()
	var until *time.Time
	if c.For > 0 {
		u := now.Add(c.For).UTC().Truncate(time.Second)
		until = &u
	}
	// The resourceVersion makes each patch conditional: two grants at once
	// each apply to what the other wrote (the loser reads and tries again).
	svc, first := f.svc, true
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			var err error
			if svc, err = m.client.CoreV1().Services(m.cfg.Namespace).Get(ctx, svc.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		first = false
		old, err := egress.DecodeGrants(svc.Annotations[keys.AnnotationEgressGrants])
		if err != nil {
			old = nil // unreadable: the proxy refuses by it too; this write replaces it
		}
		grants := egress.ApplyGrants(old, c.Allow, until, c.Revoke, now)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": svc.ResourceVersion,
			"annotations":     map[string]any{keys.AnnotationEgressGrants: nullIfEmpty(egress.EncodeGrants(grants))},
		}})
		svc, err = m.client.CoreV1().Services(m.cfg.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return api.Sandbox{}, api.Classify(err, "record the egress grants of sandbox "+id)
	}
	f.svc = svc
	return m.view(id, f), nil
}

// nullIfEmpty removes an annotation in a merge patch when there is nothing
// left to record.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

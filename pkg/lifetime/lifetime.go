// Package lifetime moves a sandbox's deadline at run time: E2B's
// setTimeout, "kill it this long from now". A sandbox's deadline is its
// workload's idle deadline (last activity plus idle timeout) capped by its
// lifetime (creation plus max lifetime), as the reap reads it
// (resources.LifetimeOf); a new timeout is a new idle timeout with the
// activity marked now, so the cap still holds: no timeout outlives the
// sandbox's max lifetime, which the Pod's activeDeadlineSeconds enforces too.
package lifetime

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/audit"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Sandboxes finds a sandbox as its caller may see it: another principal's
// is not found (sandbox.Manager.Get).
type Sandboxes interface {
	Get(ctx context.Context, id string, wait time.Duration) (api.Sandbox, error)
}

// Setter sets sandboxes' timeouts.
type Setter struct {
	cfg       *config.Config
	client    kubernetes.Interface
	sandboxes Sandboxes
	audit     audit.Log
	now       func() time.Time
}

// New returns a Setter that finds sandboxes through sandboxes and writes
// through client.
func New(cfg *config.Config, client kubernetes.Interface, sandboxes Sandboxes, auditLog *slog.Logger) *Setter {
	return &Setter{cfg: cfg, client: client, sandboxes: sandboxes, audit: audit.Log{Logger: auditLog}, now: time.Now}
}

// SetTimeout makes the sandbox expire d from now, or at its max lifetime if
// that comes first. Its own principal alone may (another gets 404). d is
// bounded as a create's idle timeout is (SANDBOX_MAX_IDLE_TIMEOUT).
func (s *Setter) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	sb, err := s.setTimeout(ctx, id, d)
	s.audit.Record(ctx, "timeout", id, api.Outcome(err), err, slog.Duration("timeout", d))
	return sb, err
}

func (s *Setter) setTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	if d < time.Second || d > s.cfg.MaxIdleTimeout {
		return api.Sandbox{}, api.Invalidf("timeout %s must be from 1s to %s (SANDBOX_MAX_IDLE_TIMEOUT)", d, s.cfg.MaxIdleTimeout)
	}
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, err := s.sandboxes.Get(ctx, id, 0)
	if err != nil {
		return api.Sandbox{}, err
	}
	// The workload holds the deadline: a ReplicaSet sandbox's ReplicaSet,
	// else its bare Pod (a claimed pooled Pod is named as its pool made
	// it, so it is found by its id and token through Get's answer below).
	name := resources.PodName(id)
	rss := s.client.AppsV1().ReplicaSets(s.cfg.Namespace)
	pods := s.client.CoreV1().Pods(s.cfg.Namespace)
	var expires string
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var (
			obj   metav1.Object
			patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) error
		)
		if rs, err := rss.Get(ctx, name, metav1.GetOptions{}); err == nil {
			obj = rs
			patch = func(ctx context.Context, n string, pt types.PatchType, b []byte, o metav1.PatchOptions, sub ...string) error {
				_, err := rss.Patch(ctx, n, pt, b, o, sub...)
				return err
			}
		} else if !apierrors.IsNotFound(err) {
			return err
		} else if pod, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil {
			obj = pod
			patch = func(ctx context.Context, n string, pt types.PatchType, b []byte, o metav1.PatchOptions, sub ...string) error {
				_, err := pods.Patch(ctx, n, pt, b, o, sub...)
				return err
			}
		} else {
			return err
		}
		// Get saw the sandbox as the caller's; this re-check covers a
		// destroy and a create by another principal in between.
		if obj.GetLabels()[keys.LabelID] != id || !c.Sees(obj) {
			return &api.Error{Kind: api.KindNotFound, Detail: "sandbox " + id + " not found"}
		}
		lt, ok := resources.LifetimeOf(obj)
		if !ok {
			return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " records no lifetime (made by DeerFlow's provisioner?), so it has no deadline to move"}
		}
		now := s.now().UTC().Truncate(time.Second)
		lt.LastActivity, lt.Idle = now, d
		expires = lt.ExpiresAt().Format(time.RFC3339)
		b, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": obj.GetResourceVersion(),
			"annotations": map[string]string{
				keys.AnnotationIdleTimeout:  strconv.FormatInt(int64(d/time.Second), 10),
				keys.AnnotationLastActivity: now.Format(time.RFC3339),
				keys.AnnotationExpiresAt:    expires,
			},
		}})
		return patch(ctx, obj.GetName(), types.MergePatchType, b, metav1.PatchOptions{})
	})
	if apierrors.IsNotFound(err) {
		return api.Sandbox{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " has no workload named " + name + " (a pooled sandbox's deadline is its template's); its timeout cannot be moved"}
	}
	if err != nil {
		return api.Sandbox{}, api.Classify(err, "set the timeout of sandbox "+id)
	}
	sb.ExpiresAt = expires
	return sb, nil
}

package sandbox

import (
	"context"
	"log/slog"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/reap"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Reap deletes every expired sandbox and every ended Pod (Succeeded/Failed,
// e.g. after activeDeadlineSeconds), with their Services, and keeps the
// warm pools (Pool.Keep). It runs on demand
// (PingSource event, reap event, HTTP) instead of in a loop, because this
// process scales to zero. Each delete carries the UID and resourceVersion it
// judged, so a sandbox touched since, or reaped by a concurrent reaper, is
// left alone and counted once (package reap).
//
// The answer names only the sandboxes the caller may see (an
// administrator: all): the reap acts for the operator, but its caller is a
// tenant, and another principal's ids are not its to learn. The audit line
// names them all.
func (m *Manager) Reap(ctx context.Context) (api.Reaped, error) {
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return api.Reaped{}, err
	}
	all, seen, err := m.reaper.Reap(ctx, c)
	if m.pool != nil {
		// Every few minutes, whoever creates: pools follow their templates.
		m.pool.Keep(ctx, m.templates)
	}
	ids := make([]string, 0, len(all.Removed))
	for _, s := range all.Removed {
		ids = append(ids, s.ID)
	}
	paused := make([]string, 0, len(all.Paused))
	for _, s := range all.Paused {
		paused = append(paused, s.ID)
	}
	m.audit.Record(ctx, "reap", "", api.Outcome(err), err, slog.Any("removed", ids), slog.Any("paused", paused))
	return seen, err
}

// newReaper is the reap of the Manager's namespace, with what it shares
// with a create.
func (m *Manager) newReaper() *reap.Reaper {
	return &reap.Reaper{Client: m.client, Namespace: m.cfg.Namespace, Remover: &m.rm, Slots: m.slots, Owners: m.owners,
		Recorder: m.recorder, Observer: m.observer, UndoWindow: m.undoWindow(), Leftover: m.leftover,
		List: func(ctx context.Context) (reap.Lists, error) {
			e, err := m.listAll(ctx, resources.SelectorAll, true)
			return reap.Lists{Pods: e.pods, ReplicaSets: e.rss, Services: e.svcs}, err
		},
		Pause: func(ctx context.Context, rs *appsv1.ReplicaSet) error {
			_, err := m.scale(ctx, rs, 0, true)
			return err
		}}
}

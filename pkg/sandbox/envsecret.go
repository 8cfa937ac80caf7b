package sandbox

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// ensureEnvSecret writes the env Secret of s, owned by svc, this create's
// own slot (envsecret.Secrets.Ensure). A create without env writes nothing
// (nil).
func (m *Manager) ensureEnvSecret(ctx context.Context, s api.Spec, svc *corev1.Service) (*corev1.Secret, error) {
	if len(s.Env) == 0 {
		return nil, nil
	}
	return m.env.Ensure(ctx, resources.EnvSecret(m.cfg.Objects(), s, svc), s.ID, func(err error) error {
		return m.createFailed(err, "Secret", s)
	})
}

// dropEnv removes the env Secret a failed create wrote (nil: none). One
// that cannot be removed now still goes with its owner, the create's slot.
func (m *Manager) dropEnv(ctx context.Context, secret *corev1.Secret) {
	if secret == nil {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
	defer cancel()
	if err := m.rm.EnvSecret(uctx, secret); err != nil {
		m.audit.Leftover(ctx, secret.Labels[keys.LabelID], err)
	}
}

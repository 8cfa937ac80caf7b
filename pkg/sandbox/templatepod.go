package sandbox

import (
	"context"
	"errors"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// resolveTemplate reads the template s asks for and fills the bounded
// fields the request left unset from it: request over template over the
// provisioner's defaults. An absent or refused template is the caller's to
// fix (422 naming it); a failure to read it is transient.
func (m *Manager) resolveTemplate(ctx context.Context, s api.Spec) (api.Spec, error) {
	t, err := m.templates.GetFor(ctx, s.Template, s.Caller.Principal) // another's template is absent
	var te *template.Error
	switch {
	case errors.Is(err, template.ErrNotFound):
		return s, &api.Error{Kind: api.KindInvalid, Detail: err.Error()}
	case errors.As(err, &te):
		return s, &api.Error{Kind: api.KindInvalid, Detail: te.Error() + "; fix the PodTemplate with kubectl edit podtemplate " + te.Template}
	case err != nil:
		return s, api.Classify(err, "read the sandbox template")
	}
	if t != nil {
		if err := api.CheckEnvAgainstTemplate(t, s.Env); err != nil {
			return s, err
		}
	}
	return resources.WithTemplate(m.cfg.Objects(), s, t), nil
}

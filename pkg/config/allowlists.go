package config

import (
	"fmt"
	"strings"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"k8s.io/apimachinery/pkg/util/validation"
)

// validateTemplateAllowLists checks SANDBOX_TEMPLATE_TOLERATIONS,
// SANDBOX_TEMPLATE_ANNOTATIONS and SANDBOX_TEMPLATE_PRIORITY_CLASSES.
func (c *TemplatesConfig) validateTemplateAllowLists() []error {
	var errs []error
	if _, err := ParseTolerations(c.TemplateTolerations); err != nil {
		errs = append(errs, fmt.Errorf("SANDBOX_TEMPLATE_TOLERATIONS: %w", err))
	}
	for _, a := range c.TemplateAnnotations {
		key := strings.TrimSuffix(a, "*")
		switch {
		case strings.HasPrefix(key, keys.Prefix):
			errs = append(errs, fmt.Errorf("SANDBOX_TEMPLATE_ANNOTATIONS: %q: sandbox.deerflow.dev/ annotations are the provisioner's bookkeeping", a))
		case key == "" || strings.Contains(key, "*") || strings.ContainsAny(key, " ,"):
			errs = append(errs, fmt.Errorf("SANDBOX_TEMPLATE_ANNOTATIONS: %q must be an annotation key, or a prefix of one ending in *", a))
		}
	}
	for _, p := range c.TemplatePriorityClasses {
		if msgs := validation.IsDNS1123Subdomain(p); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("SANDBOX_TEMPLATE_PRIORITY_CLASSES: %q: %s", p, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// AnnotationAllowed reports whether key is on allow, whose entries are
// exact keys or prefixes ending in *.
func AnnotationAllowed(allow []string, key string) bool {
	for _, a := range allow {
		if prefix, ok := strings.CutSuffix(a, "*"); ok && strings.HasPrefix(key, prefix) || a == key {
			return true
		}
	}
	return false
}

package keys

// On sandbox templates (PodTemplates), set by operators: who may use one.
const (
	// TemplatePrincipals names the principals that may create sandboxes
	// from the template, comma-separated: API keys' names, service
	// accounts' usernames, or PROVISIONER_PRINCIPAL_GROUPS groups (a
	// group's members act as the group). Without it, every principal may.
	// Any other principal finds the template absent (package template).
	TemplatePrincipals = Prefix + "principals"
)

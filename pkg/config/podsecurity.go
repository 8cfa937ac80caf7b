package config

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// PodSecurityConfig hardens the sandbox Pod: its runtime class, the nodes it
// may run on, its user and capabilities, a user namespace, and its service
// account.
type PodSecurityConfig struct {
	RuntimeClassName string            `envconfig:"SANDBOX_RUNTIME_CLASS"`
	NodeSelector     map[string]string `envconfig:"SANDBOX_NODE_SELECTOR"`
	Tolerations      []string          `envconfig:"SANDBOX_TOLERATIONS"`
	CapabilitiesAdd  []string          `envconfig:"SANDBOX_CAPABILITIES_ADD" default:"CHOWN,DAC_OVERRIDE,FOWNER,FSETID,KILL,NET_BIND_SERVICE,SETGID,SETUID"`
	RunAsNonRoot     bool              `envconfig:"SANDBOX_RUN_AS_NON_ROOT" default:"true"`
	RunAsUser        int64             `envconfig:"SANDBOX_RUN_AS_USER" default:"1000"`
	ReadOnlyRootFS   bool              `envconfig:"SANDBOX_READ_ONLY_ROOT_FS" default:"false"`
	// UserNamespace runs sandboxes with hostUsers: false: root inside is an
	// unprivileged user on the node.
	UserNamespace      bool   `envconfig:"SANDBOX_USER_NAMESPACE" default:"true"`
	ServiceAccountName string `envconfig:"SANDBOX_SERVICE_ACCOUNT"`
}

// AllowedCapabilities are the only capabilities a sandbox may be given: the
// file-ownership and process ones a package manager or a shell needs (the
// container runtime's defaults, less NET_RAW, MKNOD, SYS_CHROOT, SETFCAP,
// SETPCAP and AUDIT_WRITE). docs/configuration.md says why each is there. Anything else
// (NET_ADMIN, BPF, SYS_RAWIO, DAC_READ_SEARCH, SYS_ADMIN, ...) is refused at
// start-up, and the admission policy in config/ refuses it again.
var AllowedCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID"}

// CapabilityAllowed reports whether a sandbox may add capability, named as
// Kubernetes and the admission policy in config/ name it (CHOWN).
func CapabilityAllowed(capability string) bool {
	return slices.Contains(AllowedCapabilities, capability)
}

// Validate checks the runtime class, the tolerations, the user and the
// capabilities.
func (c *PodSecurityConfig) Validate() error {
	var p problems
	if c.RuntimeClassName != "" {
		if msgs := validation.IsDNS1123Subdomain(c.RuntimeClassName); len(msgs) > 0 {
			p.bad("SANDBOX_RUNTIME_CLASS", "%q: %s", c.RuntimeClassName, strings.Join(msgs, "; "))
		}
	}
	if _, err := ParseTolerations(c.Tolerations); err != nil {
		p.bad("SANDBOX_TOLERATIONS", "%v", err)
	}
	if c.RunAsNonRoot && c.RunAsUser == 0 {
		p.bad("SANDBOX_RUN_AS_USER", "0 (root) contradicts SANDBOX_RUN_AS_NON_ROOT=true")
	}
	if c.RunAsUser < -1 {
		p.bad("SANDBOX_RUN_AS_USER", "%d must be a user id, or -1 for the image's user", c.RunAsUser)
	}
	for _, capability := range c.CapabilitiesAdd {
		if !CapabilityAllowed(capability) {
			p.bad("SANDBOX_CAPABILITIES_ADD", "%q is not on the allow-list %s; a sandbox may not add it", capability, strings.Join(AllowedCapabilities, ","))
		}
	}
	return p.err()
}

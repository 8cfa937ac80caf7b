package config

import (
	"errors"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DeerFlowConfig is DeerFlow's sandbox: its image and port, where its
// skills and user data come from (host paths or claims), and the Lark CLI
// init container and broker sidecar.
type DeerFlowConfig struct {
	SandboxImage string `envconfig:"SANDBOX_IMAGE" default:"enterprise-public-cn-beijing.cr.volces.com/vefaas-public/all-in-one-sandbox:latest"`
	// SkillsHostPath is the seed's single skills directory. DeerFlow no
	// longer reads it (skills come from the base directory's skills_view
	// layout); start-up refuses it, saying so, rather than ignore a setting
	// an operator believes is in force.
	SkillsHostPath           string `envconfig:"SKILLS_HOST_PATH"`
	ThreadsHostPath          string `envconfig:"THREADS_HOST_PATH" default:"/.deer-flow/threads"`
	HostBaseDir              string `envconfig:"DEER_FLOW_HOST_BASE_DIR" default:"/.deer-flow"`
	SkillsPVCName            string `envconfig:"SKILLS_PVC_NAME"`
	UserdataPVCName          string `envconfig:"USERDATA_PVC_NAME"`
	SkillsPVCSubpathTemplate string `envconfig:"SKILLS_PVC_SUBPATH_TEMPLATE"`
	ContainerPort            int32  `envconfig:"SANDBOX_CONTAINER_PORT" default:"8080"`
	LarkCLIInitImage         string `envconfig:"LARK_CLI_INIT_IMAGE"`
	LarkCLIBrokerImage       string `envconfig:"LARK_CLI_BROKER_IMAGE"`
	// LarkBrokerDenySubcommands is passed to the broker sidecar as is.
	LarkBrokerDenySubcommands string `envconfig:"DEERFLOW_LARK_BROKER_DENY_SUBCOMMANDS"`
}

// AllowedExtraMountPaths is DeerFlow's allow-list of container paths that an
// extra mount may target. Anything else is refused.
var AllowedExtraMountPaths = []string{
	"/mnt/acp-workspace",
	"/mnt/skills/custom",
	"/mnt/skills/integrations",
	"/mnt/integrations/lark-cli/config",
	"/mnt/integrations/lark-cli/config/locks",
	"/mnt/integrations/lark-cli/data",
	"/mnt/integrations/lark-cli/runtime",
}

// Validate checks the image, the paths, the claims and the port.
func (c *DeerFlowConfig) Validate() error {
	var p problems
	if strings.TrimSpace(c.SandboxImage) == "" || strings.ContainsAny(c.SandboxImage, " \t\n") {
		p.bad("SANDBOX_IMAGE", "%q is not an image reference", c.SandboxImage)
	}
	if c.SkillsHostPath != "" {
		p.bad("SKILLS_HOST_PATH", "is no longer used, as in DeerFlow's provisioner: skills are mounted from DEER_FLOW_HOST_BASE_DIR "+
			"(<base>/skills_view/public, <base>/users/<user_id>/skills_view/custom and .../legacy), or with SKILLS_PVC_NAME from that claim; unset it")
	}
	for name, v := range map[string]string{"THREADS_HOST_PATH": c.ThreadsHostPath, "DEER_FLOW_HOST_BASE_DIR": c.HostBaseDir} {
		if !path.IsAbs(v) || path.Clean(v) != v {
			p.bad(name, "%q must be an absolute, clean path", v)
		}
	}
	// Every host-backed mount is rooted at a tenant's directory under the
	// base (see sandbox.hostRootOf), so the threads directory must lie under
	// the base, and not inside a user's tree, which that user's sandboxes
	// may write.
	switch users := path.Join(c.HostBaseDir, "users"); {
	case !strings.HasPrefix(c.ThreadsHostPath, c.HostBaseDir+"/"):
		p.bad("THREADS_HOST_PATH", "%q must lie under DEER_FLOW_HOST_BASE_DIR %q", c.ThreadsHostPath, c.HostBaseDir)
	case c.ThreadsHostPath == users || strings.HasPrefix(c.ThreadsHostPath, users+"/"):
		p.bad("THREADS_HOST_PATH", "%q must not lie in %s, where each user's own tree is", c.ThreadsHostPath, users)
	}
	if c.HostBaseDir == "/" {
		p.bad("DEER_FLOW_HOST_BASE_DIR", "must not be the node's root")
	}
	for name, v := range map[string]string{"SKILLS_PVC_NAME": c.SkillsPVCName, "USERDATA_PVC_NAME": c.UserdataPVCName} {
		if v == "" {
			continue
		}
		if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
			p.bad(name, "%q is not a PVC name: %s", v, strings.Join(msgs, "; "))
		}
	}
	if err := validSubPathTemplate(c.SkillsPVCSubpathTemplate); err != nil {
		p.bad("SKILLS_PVC_SUBPATH_TEMPLATE", "%q %v", c.SkillsPVCSubpathTemplate, err)
	}
	if c.ContainerPort < 1 || c.ContainerPort > 65535 {
		p.bad("SANDBOX_CONTAINER_PORT", "%d is not a port", c.ContainerPort)
	}
	return p.err()
}

// validSubPathTemplate accepts what DeerFlow formats with user_id and
// thread_id: a relative path whose only placeholders are {user_id} and
// {thread_id}, with no '.' or '..' segment, so that no value can climb out.
func validSubPathTemplate(t string) error {
	if t == "" {
		return nil
	}
	bare := strings.NewReplacer("{user_id}", "u", "{thread_id}", "t").Replace(t)
	switch {
	case strings.ContainsAny(bare, "{}"):
		return errors.New("may use only the placeholders {user_id} and {thread_id}")
	case strings.HasPrefix(bare, "/") || strings.ContainsAny(bare, "\\\x00"):
		return errors.New("must be a relative path")
	case path.Clean(bare) != bare || slices.Contains(strings.Split(bare, "/"), ".."):
		return errors.New("must be a clean path without '.' or '..' segments")
	}
	return nil
}

// Package template reads sandbox templates: core/v1 PodTemplate objects
// labelled as sandbox templates, which operators edit with kubectl and the
// API server types and validates. A template carries the Pod shape (the
// sandbox container named "sandbox", sidecars, init containers, volumes,
// imagePullSecrets, scheduling, runtime class, labels and annotations) and,
// in annotations, our settings: workload kind, lifetimes, port and whether
// DeerFlow's built-in mounts apply.
//
// A template may add to a sandbox but never weaken it: what the provisioner
// controls (names, labels, the hardening and isolation of the containment
// work, DeerFlow's mounts) is not the template's to set, and a template that
// tries is refused with an error naming the template and the field.
package template

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

const (
	// Label marks a PodTemplate as a sandbox template.
	Label = "sandbox.deer-flow.dev/template"
	// ContainerName is the sandbox container every template must have.
	ContainerName = "sandbox"

	annotationPrefix = "sandbox.deer-flow.dev/"
	// AnnotationKind is the workload kind: Pod (default) or ReplicaSet.
	AnnotationKind = annotationPrefix + "kind"
	// AnnotationIdleTimeout and AnnotationMaxLifetime are default lifetimes
	// (Go durations, e.g. 30m) for sandboxes of this template.
	AnnotationIdleTimeout = annotationPrefix + "idle-timeout"
	AnnotationMaxLifetime = annotationPrefix + "max-lifetime"
	// AnnotationPort is the sandbox container's port.
	AnnotationPort = annotationPrefix + "port"
	// AnnotationDeerFlowMounts says whether DeerFlow's skills and user-data
	// mounts apply ("true", the default, or "false").
	AnnotationDeerFlowMounts = annotationPrefix + "deerflow-mounts"
)

// Workload kinds.
const (
	KindPod        = "Pod"
	KindReplicaSet = "ReplicaSet"
)

// Template is a validated sandbox template.
type Template struct {
	Name            string
	ResourceVersion string
	Kind            string
	// IdleTimeout and MaxLifetime are zero when the template leaves them to
	// the provisioner's defaults.
	IdleTimeout, MaxLifetime time.Duration
	Port                     int32
	DeerFlowMounts           bool
	Pod                      corev1.PodTemplateSpec
}

// Error is a refused template: which one, which field, and why.
type Error struct {
	Template, Field, Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("sandbox template %q: %s: %s", e.Template, e.Field, e.Reason)
}

// FromPodTemplate validates pt against what a sandbox may be and returns the
// template, or an *Error naming the first field that would weaken a sandbox
// or that is malformed. maxLifetime is the provisioner's upper bound.
func FromPodTemplate(pt *corev1.PodTemplate, maxLifetime time.Duration) (*Template, error) {
	bad := func(field, format string, args ...any) error {
		return &Error{Template: pt.Name, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	t := &Template{Name: pt.Name, ResourceVersion: pt.ResourceVersion, Kind: KindPod, Port: 8080, DeerFlowMounts: true, Pod: *pt.Template.DeepCopy()}
	a := pt.Annotations
	if v, ok := a[AnnotationKind]; ok {
		if v != KindPod && v != KindReplicaSet {
			return nil, bad("metadata.annotations["+AnnotationKind+"]", "%q: want Pod or ReplicaSet", v)
		}
		t.Kind = v
	}
	for _, d := range []struct {
		key  string
		into *time.Duration
	}{{AnnotationIdleTimeout, &t.IdleTimeout}, {AnnotationMaxLifetime, &t.MaxLifetime}} {
		v, ok := a[d.key]
		if !ok {
			continue
		}
		dur, err := time.ParseDuration(v)
		if err != nil || dur < time.Second || dur > maxLifetime {
			return nil, bad("metadata.annotations["+d.key+"]", "%q: want a duration between 1s and the provisioner's maximum lifetime, %s", v, maxLifetime)
		}
		*d.into = dur
	}
	if v, ok := a[AnnotationPort]; ok {
		port, err := strconv.ParseInt(v, 10, 32)
		if err != nil || port < 1 || port > 65535 {
			return nil, bad("metadata.annotations["+AnnotationPort+"]", "%q: want a port, 1 to 65535", v)
		}
		t.Port = int32(port)
	}
	if v, ok := a[AnnotationDeerFlowMounts]; ok {
		mounts, err := strconv.ParseBool(v)
		if err != nil {
			return nil, bad("metadata.annotations["+AnnotationDeerFlowMounts+"]", "%q: want true or false", v)
		}
		t.DeerFlowMounts = mounts
	}
	if err := checkSpec(&t.Pod.Spec, bad); err != nil {
		return nil, err
	}
	return t, nil
}

// checkSpec refuses every Pod field that would weaken a sandbox; the
// provisioner sets those itself.
func checkSpec(spec *corev1.PodSpec, bad func(field, format string, args ...any) error) error {
	const p = "template.spec."
	switch {
	case spec.HostNetwork, spec.HostPID, spec.HostIPC:
		return bad(p+"hostNetwork/hostPID/hostIPC", "a sandbox never shares the node's namespaces")
	case spec.HostUsers != nil && *spec.HostUsers:
		return bad(p+"hostUsers", "a sandbox's user namespace is the provisioner's to set (SANDBOX_USER_NAMESPACE)")
	case spec.ServiceAccountName != "" || spec.DeprecatedServiceAccount != "":
		return bad(p+"serviceAccountName", "a sandbox runs with no ServiceAccount of a template's choosing")
	case spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken:
		return bad(p+"automountServiceAccountToken", "a sandbox never gets an API token")
	case spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace:
		return bad(p+"shareProcessNamespace", "sidecars' processes stay out of the sandbox's reach")
	case spec.NodeName != "":
		return bad(p+"nodeName", "scheduling goes through the scheduler (use nodeSelector or affinity)")
	case spec.SecurityContext != nil && spec.SecurityContext.RunAsUser != nil && *spec.SecurityContext.RunAsUser == 0:
		return bad(p+"securityContext.runAsUser", "a sandbox never runs as root")
	}
	if spec.SecurityContext != nil && len(spec.SecurityContext.Sysctls) > 0 {
		return bad(p+"securityContext.sysctls", "a sandbox sets no sysctls")
	}
	for i, v := range spec.Volumes {
		if v.HostPath != nil {
			return bad(fmt.Sprintf("%svolumes[%d].hostPath", p, i), "host paths are DeerFlow's mounts, which the provisioner adds (set %s instead)", AnnotationDeerFlowMounts)
		}
	}
	sandboxes := 0
	check := func(kind string, cs []corev1.Container) error {
		for i, c := range cs {
			f := fmt.Sprintf("%s%s[%d]", p, kind, i)
			if c.Name == ContainerName && kind == "containers" {
				sandboxes++
			}
			for j, port := range c.Ports {
				if port.HostPort != 0 || port.HostIP != "" {
					return bad(fmt.Sprintf("%s.ports[%d].hostPort", f, j), "a sandbox binds no port on the node")
				}
			}
			sc := c.SecurityContext
			if sc == nil {
				continue
			}
			switch {
			case sc.Privileged != nil && *sc.Privileged:
				return bad(f+".securityContext.privileged", "a sandbox is never privileged")
			case sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation:
				return bad(f+".securityContext.allowPrivilegeEscalation", "a sandbox never escalates privileges")
			case sc.RunAsUser != nil && *sc.RunAsUser == 0:
				return bad(f+".securityContext.runAsUser", "a sandbox never runs as root")
			case sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount:
				return bad(f+".securityContext.procMount", "a sandbox gets the default /proc")
			case sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined:
				return bad(f+".securityContext.seccompProfile", "a sandbox is never unconfined")
			}
			if sc.Capabilities != nil {
				for _, c := range sc.Capabilities.Add {
					if !config.CapabilityAllowed(string(c)) {
						return bad(f+".securityContext.capabilities.add", "%s is not on the allow-list %s", c, strings.Join(config.AllowedCapabilities, ","))
					}
				}
			}
		}
		return nil
	}
	if err := check("initContainers", spec.InitContainers); err != nil {
		return err
	}
	if err := check("containers", spec.Containers); err != nil {
		return err
	}
	if len(spec.EphemeralContainers) > 0 {
		return bad(p+"ephemeralContainers", "a template has none")
	}
	if sandboxes != 1 {
		return bad(p+"containers", "want exactly one container named %q (the sandbox); found %d", ContainerName, sandboxes)
	}
	return nil
}

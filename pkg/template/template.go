// Package template reads sandbox templates: core/v1 PodTemplate objects
// labelled as sandbox templates, which operators edit with kubectl and the
// API server types and validates. A template carries the Pod shape (the
// sandbox container named "sandbox", sidecars, init containers, volumes,
// imagePullSecrets, scheduling, runtime class, labels and annotations) and,
// in annotations, our settings: workload kind, lifetimes, idle action, port
// and whether DeerFlow's built-in mounts apply.
//
// A template may add to a sandbox but never weaken it: what the provisioner
// controls (names, labels, the hardening and isolation of the containment
// work, DeerFlow's mounts) is not the template's to set, and a template that
// tries is refused with an error naming the template and the field. Fields
// are allowed by list, not refused by list, so a Pod field that a future
// Kubernetes adds is refused until someone decides it is safe.
package template

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

const (
	// ContainerName is the sandbox container every template must have.
	ContainerName = "sandbox"
	// Default is the template a create without one uses. When no PodTemplate
	// of that name exists, the built-in default applies: the Pod the
	// provisioner's settings alone describe.
	Default = "default"
)

// Workload kinds and idle actions.
const (
	KindPod        = "Pod"
	KindReplicaSet = "ReplicaSet"

	IdleDelete = "delete"
	IdlePause  = "pause"

	defaultPausedTimeout = 24 * time.Hour
)

// Template is a validated sandbox template.
type Template struct {
	Name            string
	UID             types.UID
	ResourceVersion string
	Kind            string
	// IdleTimeout and MaxLifetime are zero when the template leaves them to
	// the provisioner's defaults.
	IdleTimeout, MaxLifetime time.Duration
	IdleAction               string
	PausedTimeout            time.Duration
	Port                     int32
	DeerFlowMounts           bool
	// CPULimit and MemoryLimit are the sandbox container's limits when the
	// template sets them: defaults a request may override within bounds.
	CPULimit, MemoryLimit *resource.Quantity
	// PoolSize is the warm pool asked for, 0 when none or when the setting
	// is refused; PoolError then says why (a template listing shows it).
	PoolSize  int
	PoolError string
	// Principals may use the template (keys.TemplatePrincipals); nil when
	// every principal may.
	Principals []string
	// Egress is the sandboxes' egress mode ("": the deployment's,
	// SANDBOX_EGRESS_MODE); EgressAllow the names an allowlist sandbox may
	// reach (nil: the deployment's, SANDBOX_EGRESS_ALLOW).
	Egress      egress.Mode
	EgressAllow []string
	// Envd puts the envd-compatible agent into the sandbox container, so
	// E2B's SDK can drive its sandboxes (keys.TemplateEnvd).
	Envd bool
	// Aliases are other names E2B's API finds the template by
	// (keys.TemplateAliases): DNS labels, none its own name.
	Aliases []string
	Pod     corev1.PodTemplateSpec
}

// Error is a refused template: which one, which field, and why.
type Error struct {
	Template, Field, Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("sandbox template %q: %s: %s", e.Template, e.Field, e.Reason)
}

// ReservedVolumeNames are the volumes the provisioner adds itself; every
// name starting with ReservedVolumePrefix is too (its host-path roots).
var ReservedVolumeNames = []string{"skills", "user-data", "tmp", "lark-cli-runtime"}

// ReservedVolumePrefix starts the names of the host-path volumes the provisioner adds.
const ReservedVolumePrefix = "host-"

// reservedVolume reports whether the provisioner may add a volume of name.
func reservedVolume(name string) bool {
	return slices.Contains(ReservedVolumeNames, name) || strings.HasPrefix(name, ReservedVolumePrefix)
}

// reservedMountRoots are container paths where DeerFlow's mounts live; a
// template mounts nothing at or below them.
var reservedMountRoots = []string{"/mnt/skills", "/mnt/user-data", "/mnt/integrations", "/mnt/acp-workspace", "/tmp"}

// FromPodTemplate is FromPodTemplateIn with the tenancy unknown: a
// template that mounts a claim read-write must name one principal.
func FromPodTemplate(pt *corev1.PodTemplate, cfg config.Objects) (*Template, error) {
	return FromPodTemplateIn(pt, cfg, Tenancy{})
}

// FromPodTemplateIn validates pt against what a sandbox may be under cfg,
// for the principals ten says may create, and returns the template, or an
// *Error naming the first field that would weaken a sandbox, expose one
// tenant's data to another, or that is malformed.
func FromPodTemplateIn(pt *corev1.PodTemplate, cfg config.Objects, ten Tenancy) (*Template, error) {
	v := validator{tmpl: pt.Name, cfg: cfg, ten: ten}
	t := &Template{Name: pt.Name, UID: pt.UID, ResourceVersion: pt.ResourceVersion, Kind: KindPod, IdleAction: IdleDelete,
		PausedTimeout: defaultPausedTimeout, Port: cfg.ContainerPort, DeerFlowMounts: true, Principals: principalsOf(pt), Pod: *pt.Template.DeepCopy()}
	if err := v.settings(pt.Annotations, t); err != nil {
		return nil, err
	}
	if err := v.metadata(t.Pod.Labels, t.Pod.Annotations); err != nil {
		return nil, err
	}
	if err := v.spec(&t.Pod.Spec, t); err != nil {
		return nil, err
	}
	if err := v.sharedStorage(t); err != nil {
		return nil, err
	}
	return t, nil
}

type validator struct {
	tmpl string
	cfg  config.Objects
	ten  Tenancy
}

func (v validator) bad(field, format string, args ...any) error {
	return &Error{Template: v.tmpl, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// settings reads our annotations on the PodTemplate object itself.
func (v validator) settings(a map[string]string, t *Template) error {
	field := func(key string) string { return "metadata.annotations[" + key + "]" }
	for _, key := range slices.Sorted(maps.Keys(a)) {
		val := a[key]
		if !strings.HasPrefix(key, keys.Prefix) {
			continue
		}
		var err error
		switch key {
		case keys.TemplateKind:
			if val != KindPod && val != KindReplicaSet {
				return v.bad(field(key), "%q: want Pod or ReplicaSet", val)
			}
			t.Kind = val
		case keys.TemplateIdleAction:
			if val != IdleDelete && val != IdlePause {
				return v.bad(field(key), "%q: want delete or pause", val)
			}
			t.IdleAction = val
		case keys.TemplatePort:
			port, err := strconv.ParseInt(val, 10, 32)
			if err != nil || int32(port) != v.cfg.ContainerPort {
				return v.bad(field(key), "%q: want %d (SANDBOX_CONTAINER_PORT), the only port the shared NetworkPolicy admits to a sandbox", val, v.cfg.ContainerPort)
			}
			t.Port = int32(port)
		case keys.TemplateDeerFlowMounts:
			mounts, err := strconv.ParseBool(val)
			if err != nil {
				return v.bad(field(key), "%q: want true or false", val)
			}
			t.DeerFlowMounts = mounts
		case keys.TemplateIdleTimeout:
			t.IdleTimeout, err = v.duration(field(key), val, v.cfg.MaxIdleTimeout)
		case keys.TemplateMaxLifetime:
			t.MaxLifetime, err = v.duration(field(key), val, v.cfg.MaxMaxLifetime)
		case keys.TemplatePausedTimeout:
			t.PausedTimeout, err = v.duration(field(key), val, v.cfg.MaxMaxLifetime)
		case keys.TemplatePrincipals:
			err = v.principals(field(key), t.Principals)
		case keys.TemplateEgress:
			if t.Egress, err = egress.ParseMode(val); err != nil || val == "" {
				return v.bad(field(key), "%q: want open, isolated or allowlist", val)
			}
		case keys.TemplateEgressAllow:
			if t.EgressAllow, err = egress.ParseNames(val); err != nil {
				return v.bad(field(key), "%v", err)
			}
		case keys.TemplateEnvd:
			if t.Envd, err = strconv.ParseBool(val); err != nil {
				return v.bad(field(key), "%q: want true or false", val)
			}
			if t.Envd && v.cfg.EnvdImage == "" {
				return v.bad(field(key), "the agent's image is not set: the operator sets SANDBOX_ENVD_IMAGE (docs/e2b.md)")
			}
		case keys.TemplateAliases:
			for _, alias := range strings.Split(val, ",") {
				alias = strings.TrimSpace(alias)
				switch {
				case alias == "":
				case len(validation.IsDNS1123Label(alias)) > 0:
					return v.bad(field(key), "%q is no template name: lowercase letters, digits and '-'", alias)
				case alias == v.tmpl:
					return v.bad(field(key), "%q is the template's own name", alias)
				case !slices.Contains(t.Aliases, alias):
					t.Aliases = append(t.Aliases, alias)
				}
			}
		case keys.TemplatePoolSize:
			n, perr := strconv.Atoi(val)
			switch {
			case perr != nil || n < 0:
				t.PoolError = fmt.Sprintf("%q: want a whole number from 0 to %d (SANDBOX_MAX_POOL_SIZE)", val, v.cfg.MaxPoolSize)
			case n > v.cfg.MaxPoolSize:
				t.PoolError = fmt.Sprintf("%d is above the operator's cap SANDBOX_MAX_POOL_SIZE=%d", n, v.cfg.MaxPoolSize)
			default:
				t.PoolSize = n
			}
		default:
			return v.bad(field(key), "unknown setting; the settings are %s", strings.Join([]string{keys.TemplateKind, keys.TemplateIdleTimeout,
				keys.TemplateMaxLifetime, keys.TemplateIdleAction, keys.TemplatePausedTimeout, keys.TemplatePort, keys.TemplateDeerFlowMounts, keys.TemplatePoolSize, keys.TemplatePrincipals, keys.TemplateEgress, keys.TemplateEgressAllow, keys.TemplateEnvd, keys.TemplateAliases}, ", "))
		}
		if err != nil {
			return err
		}
	}
	if t.EgressAllow != nil && t.Egress != egress.Allowlist {
		return v.bad(field(keys.TemplateEgressAllow), "names only an allowlist sandbox's reach: set %s: allowlist beside it", keys.TemplateEgress)
	}
	if t.IdleAction == IdlePause && t.Kind != KindReplicaSet {
		return v.bad(field(keys.TemplateIdleAction), "pause needs %s: %s (a bare Pod cannot be paused and resumed)", keys.TemplateKind, KindReplicaSet)
	}
	v.pool(t)
	return nil
}

// pool refuses a pool the template's Pods cannot be warmed for. A pooled
// Pod is made before anyone asks for it, so it can hold nothing that a
// request decides: DeerFlow's mounts are each thread's and user's own
// directories. A claimed Pod becomes a bare Pod sandbox; a ReplicaSet
// sandbox's Pods are its ReplicaSet's, made from its own Pod template.
// A refused pool leaves the template usable: its creates go the cold way.
func (v validator) pool(t *Template) {
	switch {
	case t.PoolError != "":
	case t.PoolSize == 0:
		return
	case t.DeerFlowMounts:
		t.PoolError = fmt.Sprintf("a pool on a template whose Pods need per-request data: DeerFlow's mounts give each Pod its user's and thread's directories; set %s: \"false\" to pool this template", keys.TemplateDeerFlowMounts)
	case t.Kind != KindPod:
		t.PoolError = fmt.Sprintf("a pool serves templates of %s: %s only; a claimed Pod becomes a bare Pod sandbox, not a ReplicaSet's", keys.TemplateKind, KindPod)
	case t.Egress == egress.Allowlist || t.Egress == "" && v.cfg.DefaultEgress() == egress.Allowlist:
		t.PoolError = "a pool of allowlist sandboxes is not kept: an allowlist Pod is given the egress proxy's address when its create has checked the proxy, and a pooled Pod is made before any create"
	default:
		return
	}
	t.PoolSize = 0
	t.PoolError = fmt.Sprintf("sandbox template %q: metadata.annotations[%s]: %s; no pool is kept and creates with this template start cold", v.tmpl, keys.TemplatePoolSize, t.PoolError)
}

// duration reads a lifetime setting: a Go duration from 1s to max.
func (v validator) duration(field, val string, max time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(val)
	if err != nil || d < time.Second || d > max {
		return 0, v.bad(field, "%q: want a duration between 1s and %s (the provisioner's maximum)", val, max)
	}
	return d, nil
}

// metadata refuses labels that would change what selects the sandbox
// (isolation, ingress to the backend and the provisioner, identity) and
// annotations that would loosen its confinement or forge our bookkeeping.
func (v validator) metadata(labels, annotations map[string]string) error {
	owned := []string{"app", "sandbox-id"}
	for k := range v.cfg.IngressFromPodLabels {
		owned = append(owned, k)
	}
	for k := range v.cfg.DNSPodLabels {
		owned = append(owned, k)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if slices.Contains(owned, k) || strings.HasPrefix(k, "app.kubernetes.io/") || strings.HasPrefix(k, keys.Prefix) || strings.Contains(k, "knative.dev/") {
			return v.bad("template.metadata.labels["+k+"]", "the provisioner's label, or one a NetworkPolicy selects peers by; a sandbox's labels must not widen what it can reach")
		}
	}
	// Annotations reach the container runtime (io.katacontainers.*,
	// io.kubernetes.cri-o.*, AppArmor, seccomp): allowed by list, not
	// refused by list, so a runtime's new key is refused until an operator
	// decides it is safe (SANDBOX_TEMPLATE_ANNOTATIONS, which the admission
	// policy's parameters must admit too).
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if strings.HasPrefix(k, keys.Prefix) {
			return v.bad("template.metadata.annotations["+k+"]", "the provisioner's bookkeeping is not a template's to set")
		}
		if !config.AnnotationAllowed(v.cfg.TemplateAnnotations, k) {
			return v.bad("template.metadata.annotations["+k+"]", "not on the allow-list SANDBOX_TEMPLATE_ANNOTATIONS (%s)", strings.Join(v.cfg.TemplateAnnotations, ","))
		}
	}
	return nil
}

// podFields are the PodSpec fields a template may set (by JSON name).
// Defaulted ones (restartPolicy, dnsPolicy, schedulerName, grace period,
// enableServiceLinks, an empty securityContext) appear in every template the
// API server returns; the provisioner sets those itself, so their values
// are checked below or overridden.
var podFields = []string{"volumes", "initContainers", "containers", "imagePullSecrets", "nodeSelector", "affinity", "tolerations",
	"runtimeClassName", "priorityClassName", "topologySpreadConstraints", "securityContext",
	"restartPolicy", "dnsPolicy", "schedulerName", "terminationGracePeriodSeconds", "enableServiceLinks"}

var containerFields = []string{"name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
	"volumeMounts", "livenessProbe", "readinessProbe", "startupProbe", "imagePullPolicy", "securityContext", "restartPolicy",
	"terminationMessagePath", "terminationMessagePolicy", "resizePolicy"}

func (v validator) spec(spec *corev1.PodSpec, t *Template) error {
	const p = "template.spec."
	switch {
	case spec.HostNetwork, spec.HostPID, spec.HostIPC:
		return v.bad(p+"hostNetwork/hostPID/hostIPC", "a sandbox never shares the node's namespaces")
	case spec.HostUsers != nil && *spec.HostUsers:
		return v.bad(p+"hostUsers", "a sandbox's user namespace is the provisioner's to set (SANDBOX_USER_NAMESPACE)")
	case spec.ServiceAccountName != "" || spec.DeprecatedServiceAccount != "":
		return v.bad(p+"serviceAccountName", "a sandbox runs with no ServiceAccount of a template's choosing")
	case spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken:
		return v.bad(p+"automountServiceAccountToken", "a sandbox never gets an API token")
	case spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace:
		return v.bad(p+"shareProcessNamespace", "sidecars' processes stay out of the sandbox's reach")
	case spec.NodeName != "":
		return v.bad(p+"nodeName", "scheduling goes through the scheduler (use nodeSelector or affinity)")
	case spec.RestartPolicy != "" && spec.RestartPolicy != corev1.RestartPolicyAlways:
		return v.bad(p+"restartPolicy", "a sandbox restarts its containers (Always)")
	case spec.DNSPolicy != "" && spec.DNSPolicy != corev1.DNSClusterFirst:
		return v.bad(p+"dnsPolicy", "a sandbox resolves through the cluster's DNS (ClusterFirst), the only resolver its NetworkPolicy admits")
	case spec.SchedulerName != "" && spec.SchedulerName != corev1.DefaultSchedulerName:
		return v.bad(p+"schedulerName", "sandboxes use the default scheduler")
	case v.cfg.RuntimeClassName != "" && spec.RuntimeClassName != nil && *spec.RuntimeClassName != v.cfg.RuntimeClassName:
		return v.bad(p+"runtimeClassName", "SANDBOX_RUNTIME_CLASS is %s; a template cannot choose a weaker runtime", v.cfg.RuntimeClassName)
	case v.cfg.RuntimeClassName == "" && spec.RuntimeClassName != nil && *spec.RuntimeClassName != "":
		// The admission policy admits exactly the deployment's class: with
		// none set, only Pods that name none.
		return v.bad(p+"runtimeClassName", "SANDBOX_RUNTIME_CLASS is empty (the node's default runtime), so sandboxes name no class; set SANDBOX_RUNTIME_CLASS=%s to run every sandbox under it", *spec.RuntimeClassName)
	}
	if f := setExcept(*spec, podFields); f != "" {
		return v.bad(p+f, "not a field a template may set; the provisioner controls it")
	}
	if spec.PriorityClassName != "" && !slices.Contains(v.cfg.TemplatePriorityClasses, spec.PriorityClassName) {
		return v.bad(p+"priorityClassName", "%q is not on the allow-list SANDBOX_TEMPLATE_PRIORITY_CLASSES (%s); a sandbox must not preempt the cluster's workloads",
			spec.PriorityClassName, strings.Join(v.cfg.TemplatePriorityClasses, ","))
	}
	for i, tl := range spec.Tolerations {
		if !v.tolerationAllowed(tl) {
			return v.bad(fmt.Sprintf("%stolerations[%d]", p, i), "not on the allow-lists SANDBOX_TOLERATIONS and SANDBOX_TEMPLATE_TOLERATIONS (key[=value]:Effect); a sandbox must not land on nodes kept for others")
		}
	}
	if sc := spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			return v.bad(p+"securityContext.runAsUser", "a sandbox never runs as root")
		}
		if len(sc.Sysctls) > 0 {
			return v.bad(p+"securityContext.sysctls", "a sandbox sets no sysctls")
		}
		if f := setExcept(*sc, []string{"fsGroup", "fsGroupChangePolicy", "supplementalGroups"}); f != "" {
			return v.bad(p+"securityContext."+f, "the provisioner sets the Pod's security context; a template may set fsGroup, fsGroupChangePolicy and supplementalGroups")
		}
	}
	for i, vol := range spec.Volumes {
		if err := v.volume(fmt.Sprintf("%svolumes[%d]", p, i), vol); err != nil {
			return err
		}
	}
	sandboxes := 0
	sidecars := corev1.ResourceList{} // the sum of the sidecars' limits
	for _, group := range []struct {
		kind string
		cs   []corev1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}} {
		for i := range group.cs {
			c := &group.cs[i]
			f := fmt.Sprintf("%s%s[%d]", p, group.kind, i)
			if c.Name == ContainerName {
				if group.kind != "containers" {
					return v.bad(f+".name", "%q is the sandbox container, not an init container", ContainerName)
				}
				sandboxes++
				if err := v.sandboxResources(f, c, t); err != nil {
					return err
				}
			}
			if strings.HasPrefix(c.Name, "lark-cli-") {
				return v.bad(f+".name", "lark-cli-* containers are the provisioner's")
			}
			if err := v.container(f, c); err != nil {
				return err
			}
		}
	}
	if sandboxes != 1 {
		return v.bad(p+"containers", "want exactly one container named %q (the sandbox); found %d", ContainerName, sandboxes)
	}
	for _, group := range []struct {
		kind string
		cs   []corev1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}} {
		for i := range group.cs {
			if c := &group.cs[i]; c.Name != ContainerName {
				if err := v.sidecarResources(fmt.Sprintf("%s%s[%d]", p, group.kind, i), c, group.kind == "containers", sidecars); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// volumeSources are the volume types a template may use: data volumes the
// kubelet mounts for the Pod, but no Secret. hostPath is DeerFlow's mounts, which the
// provisioner adds; in-tree drivers and gitRepo run node-side code; a
// projected ServiceAccount token would hand the sandbox an API credential.
// Secrets are not mounted: the provisioner's own API keys live in the same
// namespace, and a sandbox runs the agent's code.
var volumeSources = []string{"emptyDir", "configMap", "projected", "downwardAPI", "persistentVolumeClaim", "nfs", "csi", "ephemeral", "image"}

func (v validator) volume(f string, vol corev1.Volume) error {
	if reservedVolume(vol.Name) {
		return v.bad(f+".name", "%q is a volume the provisioner adds; choose another name", vol.Name)
	}
	if vol.HostPath != nil {
		return v.bad(f+".hostPath", "host paths are DeerFlow's mounts, which the provisioner adds (set %s instead)", keys.TemplateDeerFlowMounts)
	}
	if vol.Secret != nil {
		return v.bad(f+".secret", "a sandbox mounts no Secret (the provisioner's API keys live in the same namespace)")
	}
	if src := setExcept(vol.VolumeSource, volumeSources); src != "" {
		return v.bad(f+"."+src, "not a volume type a sandbox may use; use one of %s", strings.Join(volumeSources, ", "))
	}
	if vol.Projected != nil {
		for j, s := range vol.Projected.Sources {
			if s.ServiceAccountToken != nil || s.PodCertificate != nil {
				return v.bad(fmt.Sprintf("%s.projected.sources[%d]", f, j), "a sandbox never gets a ServiceAccount token or Pod certificate")
			}
			if s.Secret != nil {
				return v.bad(fmt.Sprintf("%s.projected.sources[%d].secret", f, j), "a sandbox mounts no Secret")
			}
		}
	}
	return nil
}

func (v validator) container(f string, c *corev1.Container) error {
	if field := setExcept(*c, containerFields); field != "" {
		return v.bad(f+"."+field, "not a field a template may set on a container")
	}
	if len(c.EnvFrom) > 0 {
		return v.bad(f+".envFrom", "a sandbox takes no environment from Secrets or ConfigMaps wholesale; name each variable in env")
	}
	for j, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return v.bad(fmt.Sprintf("%s.env[%d].valueFrom.secretKeyRef", f, j), "a sandbox reads no Secret")
		}
	}
	for j, port := range c.Ports {
		if port.HostPort != 0 || port.HostIP != "" {
			return v.bad(fmt.Sprintf("%s.ports[%d].hostPort", f, j), "a sandbox binds no port on the node")
		}
	}
	for j, m := range c.VolumeMounts {
		mf := fmt.Sprintf("%s.volumeMounts[%d]", f, j)
		for _, root := range reservedMountRoots {
			if root == "/tmp" && !v.cfg.ReadOnlyRootFS {
				continue // the provisioner mounts /tmp only over a read-only root
			}
			if m.MountPath == root || strings.HasPrefix(m.MountPath, root+"/") {
				return v.bad(mf+".mountPath", "%s is where the provisioner mounts DeerFlow's data; mount elsewhere", m.MountPath)
			}
		}
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			return v.bad(mf+".mountPropagation", "a sandbox never propagates mounts to the node")
		}
		if reservedVolume(m.Name) {
			return v.bad(mf+".name", "%q is a volume the provisioner adds", m.Name)
		}
	}
	for name, pr := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
		if pr != nil && (pr.HTTPGet != nil && pr.HTTPGet.Host != "" || pr.TCPSocket != nil && pr.TCPSocket.Host != "") {
			return v.bad(f+"."+name, "a probe checks the sandbox itself; the kubelet is not sent to another host")
		}
	}
	sc := c.SecurityContext
	if sc == nil {
		return nil
	}
	switch {
	case sc.Privileged != nil && *sc.Privileged:
		return v.bad(f+".securityContext.privileged", "a sandbox is never privileged")
	case sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation:
		return v.bad(f+".securityContext.allowPrivilegeEscalation", "a sandbox never escalates privileges")
	case sc.RunAsUser != nil && *sc.RunAsUser == 0:
		return v.bad(f+".securityContext.runAsUser", "a sandbox never runs as root")
	case sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount:
		return v.bad(f+".securityContext.procMount", "a sandbox gets the default /proc")
	case sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		return v.bad(f+".securityContext.seccompProfile", "a sandbox runs with the runtime's default seccomp profile")
	}
	if sc.Capabilities != nil {
		for _, cap := range sc.Capabilities.Add {
			if !config.CapabilityAllowed(string(cap)) {
				return v.bad(f+".securityContext.capabilities.add", "%s is not on the allow-list %s", cap, strings.Join(config.AllowedCapabilities, ","))
			}
		}
	}
	if field := setExcept(*sc, []string{"capabilities", "privileged", "allowPrivilegeEscalation", "seccompProfile", "readOnlyRootFilesystem"}); field != "" {
		return v.bad(f+".securityContext."+field, "the provisioner sets a container's security context; a template may only add capabilities from the allow-list")
	}
	return nil
}

// sandboxResources reads the sandbox container's cpu and memory limits as
// defaults within the provisioner's bounds. Requests for them are derived
// by the provisioner (memory requests equal limits), so a template sets none.
func (v validator) sandboxResources(f string, c *corev1.Container, t *Template) error {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if _, ok := c.Resources.Requests[name]; ok {
			return v.bad(f+".resources.requests."+string(name), "the provisioner derives the sandbox's requests; set limits")
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceEphemeralStorage]; ok {
		return v.bad(f+".resources.limits.ephemeral-storage", "SANDBOX_EPHEMERAL_STORAGE sets it")
	}
	for _, r := range []struct {
		name     corev1.ResourceName
		min, max string
		into     **resource.Quantity
	}{{corev1.ResourceCPU, v.cfg.CPURequest, v.cfg.MaxCPULimit, &t.CPULimit}, {corev1.ResourceMemory, v.cfg.MemoryRequest, v.cfg.MaxMemoryLimit, &t.MemoryLimit}} {
		q, ok := c.Resources.Limits[r.name]
		if !ok {
			continue
		}
		if q.Cmp(resource.MustParse(r.min)) < 0 || q.Cmp(resource.MustParse(r.max)) > 0 {
			return v.bad(f+".resources.limits."+string(r.name), "%s: want between %s and %s (the provisioner's bounds)", q.String(), r.min, r.max)
		}
		q = q.DeepCopy()
		*r.into = &q
	}
	return nil
}

// setExcept returns the JSON name of the first field of the struct s that is
// set (not its zero value) and not in allowed, or "".
func setExcept(s any, allowed []string) string {
	rv := reflect.ValueOf(s)
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" || slices.Contains(allowed, name) || rv.Field(i).IsZero() {
			continue
		}
		return name
	}
	return ""
}

// sidecarResources requires a sidecar or init container to set cpu and
// memory limits within the provisioner's maxima (SANDBOX_MAX_CPU_LIMIT,
// SANDBOX_MAX_MEMORY_LIMIT), and the sidecars, which run beside the
// sandbox, to stay within them together: a template cannot make a sandbox
// unbounded through its helpers.
func (v validator) sidecarResources(f string, c *corev1.Container, sidecar bool, sum corev1.ResourceList) error {
	for _, r := range []struct {
		name corev1.ResourceName
		max  string
		env  string
	}{{corev1.ResourceCPU, v.cfg.MaxCPULimit, "SANDBOX_MAX_CPU_LIMIT"}, {corev1.ResourceMemory, v.cfg.MaxMemoryLimit, "SANDBOX_MAX_MEMORY_LIMIT"}} {
		field := f + ".resources.limits." + string(r.name)
		q, ok := c.Resources.Limits[r.name]
		if !ok {
			return v.bad(field, "required: a template's other containers set cpu and memory limits, at most %s (%s)", r.max, r.env)
		}
		max := resource.MustParse(r.max)
		if q.Cmp(max) > 0 {
			return v.bad(field, "%s: want at most %s (%s)", q.String(), r.max, r.env)
		}
		if !sidecar {
			continue // init containers run one at a time, before the sandbox
		}
		total := sum[r.name]
		total.Add(q)
		sum[r.name] = total
		if total.Cmp(max) > 0 {
			return v.bad(field, "the sidecars' limits add up to %s: want at most %s (%s) together", total.String(), r.max, r.env)
		}
	}
	return nil
}

// tolerationAllowed reports whether t is one of the operator's tolerations
// (SANDBOX_TOLERATIONS, SANDBOX_TEMPLATE_TOLERATIONS) or narrower: the same
// key and effect, and the same value unless the entry takes any value.
// The admission policy's parameters must admit the same entries.
func (v validator) tolerationAllowed(t corev1.Toleration) bool {
	allowed, _ := config.ParseTolerations(append(slices.Clone(v.cfg.Tolerations), v.cfg.TemplateTolerations...)) // validated at start-up
	if t.Key == "" || t.Effect == "" {
		return false // every key, or every effect
	}
	for _, a := range allowed {
		if a.Key != t.Key || a.Effect != t.Effect {
			continue
		}
		switch {
		case a.Operator == corev1.TolerationOpExists:
			return true
		case t.Operator != corev1.TolerationOpExists && t.Value == a.Value:
			return true
		}
	}
	return false
}

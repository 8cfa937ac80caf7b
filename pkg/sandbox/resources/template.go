package resources

import (
	"maps"
	"slices"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	corev1 "k8s.io/api/core/v1"
)

// applyTemplate lays the template's Pod shape under the Pod the provisioner
// built. What the template adds (containers, volumes, pull secrets,
// scheduling, labels) is taken; what the provisioner controls (names, the
// sandbox labels and annotations, security contexts, service account and
// token, DeerFlow's mounts, the port, lifetimes) stays as built. The
// template was validated (package template), so nothing here re-checks it.
func applyTemplate(cfg *config.PodSecurityConfig, t *template.Template, pod *corev1.Pod) {
	tp := t.Pod.DeepCopy()
	pod.Labels = overlay(tp.Labels, pod.Labels)
	pod.Annotations = overlay(tp.Annotations, pod.Annotations)
	pod.Annotations[keys.AnnotationTemplate] = t.Name

	spec, ts := &pod.Spec, &tp.Spec
	for i := range ts.Containers {
		c := &ts.Containers[i]
		if c.Name == template.ContainerName {
			mergeSandbox(cfg, &spec.Containers[0], c)
			continue
		}
		c.SecurityContext = hardened(cfg, nil, c.SecurityContext)
		spec.Containers = append(spec.Containers, *c)
	}
	for i := range ts.InitContainers {
		c := &ts.InitContainers[i]
		c.SecurityContext = hardened(cfg, nil, c.SecurityContext)
		spec.InitContainers = append(spec.InitContainers, *c)
	}
	spec.Volumes = append(spec.Volumes, ts.Volumes...)
	spec.ImagePullSecrets = ts.ImagePullSecrets
	spec.Affinity = ts.Affinity
	spec.PriorityClassName = ts.PriorityClassName
	spec.TopologySpreadConstraints = ts.TopologySpreadConstraints
	spec.Tolerations = append(spec.Tolerations, ts.Tolerations...)
	// The operator's SANDBOX_NODE_SELECTOR wins over a template's.
	if sel := overlay(ts.NodeSelector, spec.NodeSelector); len(sel) > 0 {
		spec.NodeSelector = sel
	}
	if spec.RuntimeClassName == nil && ts.RuntimeClassName != nil {
		spec.RuntimeClassName = ts.RuntimeClassName
	}
	if psc := ts.SecurityContext; psc != nil {
		spec.SecurityContext.FSGroup = psc.FSGroup
		spec.SecurityContext.FSGroupChangePolicy = psc.FSGroupChangePolicy
		spec.SecurityContext.SupplementalGroups = psc.SupplementalGroups
	}
}

// mergeSandbox takes the template's sandbox container fields over the
// built ones, except what the provisioner controls: name, port, the
// resources it derived (cpu, memory, ephemeral storage), its environment
// variables and mounts, and the security context (capabilities only grow,
// within the allow-list both were checked against).
func mergeSandbox(cfg *config.PodSecurityConfig, sb, t *corev1.Container) {
	if t.Image != "" {
		sb.Image = t.Image
	}
	if t.ImagePullPolicy != "" {
		sb.ImagePullPolicy = t.ImagePullPolicy
	}
	sb.Command, sb.Args, sb.WorkingDir, sb.EnvFrom, sb.ResizePolicy = t.Command, t.Args, t.WorkingDir, t.EnvFrom, t.ResizePolicy
	var env []corev1.EnvVar
	for _, e := range t.Env {
		if !slices.ContainsFunc(sb.Env, func(o corev1.EnvVar) bool { return o.Name == e.Name }) {
			env = append(env, e)
		}
	}
	sb.Env = append(env, sb.Env...)
	sb.VolumeMounts = append(sb.VolumeMounts, t.VolumeMounts...)
	for _, p := range []struct{ from, into **corev1.Probe }{
		{&t.ReadinessProbe, &sb.ReadinessProbe}, {&t.LivenessProbe, &sb.LivenessProbe}, {&t.StartupProbe, &sb.StartupProbe},
	} {
		if *p.from != nil {
			*p.into = *p.from
		}
	}
	// Extended resources (GPUs and the like) come from the template.
	for _, pair := range []struct{ from, into corev1.ResourceList }{
		{t.Resources.Limits, sb.Resources.Limits}, {t.Resources.Requests, sb.Resources.Requests},
	} {
		for name, q := range pair.from {
			if name != corev1.ResourceCPU && name != corev1.ResourceMemory && name != corev1.ResourceEphemeralStorage {
				pair.into[name] = q
			}
		}
	}
	sb.SecurityContext = hardened(cfg, cfg.CapabilitiesAdd, t.SecurityContext)
}

// hardened is the provisioner's container security context, with the
// allow-listed capabilities the template adds and, if it asks, a read-only
// root file system (which only tightens).
func hardened(cfg *config.PodSecurityConfig, base []string, from *corev1.SecurityContext) *corev1.SecurityContext {
	add := slices.Clone(base)
	readOnly := false
	if from != nil {
		if from.Capabilities != nil {
			for _, c := range from.Capabilities.Add {
				if config.CapabilityAllowed(string(c)) && !slices.Contains(add, string(c)) {
					add = append(add, string(c))
				}
			}
		}
		readOnly = from.ReadOnlyRootFilesystem != nil && *from.ReadOnlyRootFilesystem
	}
	sc := containerSecurityContext(cfg, add)
	if readOnly {
		*sc.ReadOnlyRootFilesystem = true
	}
	return sc
}

// overlay returns base with top's entries over it (top wins).
func overlay(base, top map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(top))
	maps.Copy(out, base)
	maps.Copy(out, top)
	return out
}

package sandbox

import (
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// Container paths of the built-in mounts.
const (
	mountSkillsPublic = "/mnt/skills/public"
	mountSkillsCustom = "/mnt/skills/custom"
	mountSkillsLegacy = "/mnt/skills/legacy"
	mountUserData     = "/mnt/user-data"
	mountLarkRuntime  = "/mnt/integrations/lark-cli/runtime"
)

// mountEntry is one volume at one container path. Building the mounts as a
// table keyed by container path is what makes duplicates impossible: an extra
// mount replaces a built-in one at the same path instead of being added twice
// (DeerFlow always sends /mnt/skills/custom, and the API server rejects a Pod
// that mounts one path twice).
type mountEntry struct {
	path     string
	volume   corev1.Volume
	subPath  string
	readOnly bool
}

// BuildPod returns the sandbox Pod for spec. It is a pure function of its
// arguments, which is what the builder tests pin.
func BuildPod(cfg *config.Config, s Spec) *corev1.Pod {
	mounts := podMounts(cfg, s)
	var volumes []corev1.Volume
	var volumeMounts []corev1.VolumeMount
	seenVolume := map[string]bool{}
	for _, m := range mounts {
		if !seenVolume[m.volume.Name] {
			seenVolume[m.volume.Name] = true
			volumes = append(volumes, m.volume)
		}
		volumeMounts = append(volumeMounts, corev1.VolumeMount{
			Name: m.volume.Name, MountPath: m.path, SubPath: m.subPath, ReadOnly: m.readOnly,
		})
	}
	if cfg.ReadOnlyRootFS {
		volumes = append(volumes, corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		volumeMounts = append(volumeMounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	}

	var env []corev1.EnvVar
	if s.MaxShellSessions > 0 {
		env = append(env, corev1.EnvVar{Name: "MAX_SHELL_SESSIONS", Value: strconv.Itoa(s.MaxShellSessions)})
	}
	env = append(env, requestEnv(s.Env)...)

	tolerations, _ := config.ParseTolerations(cfg.Tolerations) // validated at start-up
	port := cfg.ContainerPort
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(s.ID),
			Namespace:   cfg.Namespace,
			Labels:      labels(s),
			Annotations: annotations(s),
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           cfg.SandboxImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Ports:           []corev1.ContainerPort{{Name: portName, ContainerPort: port, Protocol: corev1.ProtocolTCP}},
				Env:             env,
				StartupProbe:    probe(port, startupProbePeriod, startupProbeFailures),
				ReadinessProbe:  probe(port, 5, 3),
				LivenessProbe:   probe(port, 10, 3),
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:              minQuantity(resource.MustParse(cfg.CPURequest), s.CPULimit),
						corev1.ResourceMemory:           memoryRequest(cfg, s),
						corev1.ResourceEphemeralStorage: resource.MustParse(cfg.EphemeralStorage),
					},
					Limits: corev1.ResourceList{
						corev1.ResourceCPU:              s.CPULimit,
						corev1.ResourceMemory:           s.MemoryLimit,
						corev1.ResourceEphemeralStorage: resource.MustParse(cfg.EphemeralStorage),
					},
				},
				VolumeMounts:    volumeMounts,
				SecurityContext: containerSecurityContext(cfg, cfg.CapabilitiesAdd),
			}},
			Volumes:                       volumes,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			ActiveDeadlineSeconds:         ptr.To(int64(s.MaxLifetime / time.Second)),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			ServiceAccountName:            cfg.ServiceAccountName,
			NodeSelector:                  cfg.NodeSelector,
			Tolerations:                   tolerations,
			TerminationGracePeriodSeconds: ptr.To(int64(10)),
			SecurityContext:               podSecurityContext(cfg),
		},
	}
	if cfg.UserNamespace {
		pod.Spec.HostUsers = ptr.To(false)
	}
	if cfg.RuntimeClassName != "" {
		pod.Spec.RuntimeClassName = ptr.To(cfg.RuntimeClassName)
	}
	if len(pod.Spec.NodeSelector) == 0 {
		pod.Spec.NodeSelector = nil
	}
	addLarkContainers(cfg, s, pod, mounts)
	if s.Resolved != nil {
		applyTemplate(cfg, s.Resolved, pod)
	}
	return pod
}

func podMounts(cfg *config.Config, s Spec) []mountEntry {
	table := []mountEntry{}
	set := func(e mountEntry) {
		for i := range table {
			if table[i].path == e.path {
				table[i] = e
				return
			}
		}
		table = append(table, e)
	}
	skills := func(name, at string) mountEntry {
		if cfg.SkillsPVCName != "" {
			sub := strings.NewReplacer("{name}", name, "{user_id}", s.UserID).Replace(cfg.SkillsPVCSubpathTemplate)
			return mountEntry{path: at, volume: pvcVolume("skills", cfg.SkillsPVCName, true), subPath: sub, readOnly: true}
		}
		return hostMount(cfg, at, path.Join(cfg.SkillsHostPath, name), true)
	}
	if s.Resolved == nil || s.Resolved.DeerFlowMounts {
		set(skills("public", mountSkillsPublic))
		set(skills("custom", mountSkillsCustom))
		if s.IncludeLegacySkills {
			set(skills("legacy", mountSkillsLegacy))
		}
		if cfg.UserdataPVCName != "" {
			set(mountEntry{path: mountUserData, volume: pvcVolume("user-data", cfg.UserdataPVCName, false),
				subPath: path.Join("users", s.UserID, "threads", s.ThreadID, "user-data")})
		} else {
			set(hostMount(cfg, mountUserData, path.Join(cfg.ThreadsHostPath, s.ThreadID, "user-data"), false))
		}
	}
	if s.LarkCLIRuntime {
		set(mountEntry{path: mountLarkRuntime, volume: corev1.Volume{Name: "lark-cli-runtime",
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}})
	}
	for _, m := range s.Mounts {
		set(hostMount(cfg, m.ContainerPath, m.HostPath, m.ReadOnly))
	}
	return table
}

// hostMount mounts hostPath, which lies under the base directory (config
// and request validation see to it), as a subPath of the one hostPath volume
// for that base. The kubelet resolves a subPath inside its volume and refuses
// one that a symlink leads out of it; a plain hostPath volume would follow a
// link a sandbox planted in its writable user data (x -> /) to the node's root.
func hostMount(cfg *config.Config, at, hostPath string, readOnly bool) mountEntry {
	return mountEntry{path: at, volume: hostBaseVolume(cfg), subPath: strings.TrimPrefix(hostPath, cfg.HostBaseDir+"/"), readOnly: readOnly}
}

// addLarkContainers adds the Lark CLI init container (installs the CLI into
// the runtime mount) and broker sidecar, when the operator configured their
// images and the request asked for them.
func addLarkContainers(cfg *config.Config, s Spec, pod *corev1.Pod, mounts []mountEntry) {
	none := []string{}
	if s.LarkCLIRuntime {
		var vm []corev1.VolumeMount
		for _, m := range mounts {
			if m.path == mountLarkRuntime {
				vm = append(vm, corev1.VolumeMount{Name: m.volume.Name, MountPath: m.path, SubPath: m.subPath})
			}
		}
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
			Name: "lark-cli-init", Image: cfg.LarkCLIInitImage, ImagePullPolicy: corev1.PullIfNotPresent,
			VolumeMounts: vm, SecurityContext: containerSecurityContext(cfg, none),
			Env: []corev1.EnvVar{{Name: "LARK_CLI_RUNTIME_DIR", Value: mountLarkRuntime}},
		})
	}
	if s.LarkCLIBroker {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name: "lark-cli-broker", Image: cfg.LarkCLIBrokerImage, ImagePullPolicy: corev1.PullIfNotPresent,
			SecurityContext: containerSecurityContext(cfg, none),
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			},
		})
	}
}

// requestEnv is the request's env in name order, each value literal: the
// kubelet expands $(NAME) in an env value to another variable's value and
// reads $$ as $, so every $ is doubled and a request can name no other
// variable, only plain values.
func requestEnv(in map[string]string) []corev1.EnvVar {
	var env []corev1.EnvVar
	for _, name := range slices.Sorted(maps.Keys(in)) {
		env = append(env, corev1.EnvVar{Name: name, Value: strings.ReplaceAll(in[name], "$", "$$")})
	}
	return env
}

func annotations(s Spec) map[string]string {
	a := map[string]string{
		AnnotationUserID:       s.UserID,
		AnnotationThreadID:     s.ThreadID,
		AnnotationCreatedAt:    s.Now.Format(time.RFC3339),
		AnnotationLastActivity: s.Now.Format(time.RFC3339),
		AnnotationIdleTimeout:  strconv.FormatInt(int64(s.IdleTimeout/time.Second), 10),
		AnnotationMaxLifetime:  strconv.FormatInt(int64(s.MaxLifetime/time.Second), 10),
		AnnotationExpiresAt:    expiresAt(s.Now, s.Now, s.IdleTimeout, s.MaxLifetime).Format(time.RFC3339),
	}
	if s.MaxShellSessions > 0 {
		a[AnnotationMaxShellSessions] = strconv.Itoa(s.MaxShellSessions)
	}
	return a
}

// expiresAt is the earlier of the idle deadline and the lifetime cap.
func expiresAt(created, lastActivity time.Time, idle, lifetime time.Duration) time.Time {
	idleEnd, hardEnd := lastActivity.Add(idle), created.Add(lifetime)
	if idleEnd.Before(hardEnd) {
		return idleEnd
	}
	return hardEnd
}

// The sandbox's probes, all HTTP GET /v1/sandbox and none with a fixed
// initial delay. The startup probe asks every second, so the Pod is Ready
// within a second of the sandbox answering (DeerFlow's readiness probe
// waited 5 s first, whatever the image), and gives a slow image five minutes
// (300 failures) before the kubelet restarts it. Readiness and liveness run
// only once it has passed; the kubelet runs the readiness probe at once
// then rather than waiting for its period. A template may replace any of
// the three (templatepod.go).
const (
	startupProbePeriod   = 1
	startupProbeFailures = 300
)

func probe(port int32, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/v1/sandbox", Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP,
		}},
		PeriodSeconds: period, TimeoutSeconds: 3, FailureThreshold: failures, SuccessThreshold: 1,
	}
}

func podSecurityContext(cfg *config.Config) *corev1.PodSecurityContext {
	sc := &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	if cfg.RunAsUser >= 0 {
		sc.RunAsUser = ptr.To(cfg.RunAsUser)
		sc.RunAsGroup = ptr.To(cfg.RunAsUser)
	}
	if cfg.RunAsNonRoot {
		sc.RunAsNonRoot = ptr.To(true)
	}
	return sc
}

func containerSecurityContext(cfg *config.Config, add []string) *corev1.SecurityContext {
	caps := &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
	for _, c := range add {
		caps.Add = append(caps.Add, corev1.Capability(c))
	}
	return &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(cfg.ReadOnlyRootFS),
		Capabilities:             caps,
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// hostBaseVolumeName names the one hostPath volume of a sandbox.
const hostBaseVolumeName = "host-base"

// hostBaseVolume is the base directory, which must already exist on the node
// (type Directory: the kubelet creates nothing outside what subPaths name).
func hostBaseVolume(cfg *config.Config) corev1.Volume {
	return corev1.Volume{Name: hostBaseVolumeName, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: cfg.HostBaseDir, Type: ptr.To(corev1.HostPathDirectory),
	}}}
}

func pvcVolume(name, claim string, readOnly bool) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
		ClaimName: claim, ReadOnly: readOnly,
	}}}
}

// memoryRequest is the limit itself by default, so that the scheduler
// reserves all a sandbox may use and no sandbox can overcommit its node.
func memoryRequest(cfg *config.Config, s Spec) resource.Quantity {
	if cfg.MemoryRequestEqualsLimit {
		return s.MemoryLimit
	}
	return minQuantity(resource.MustParse(cfg.MemoryRequest), s.MemoryLimit)
}

func minQuantity(a, b resource.Quantity) resource.Quantity {
	if a.Cmp(b) <= 0 {
		return a
	}
	return b
}

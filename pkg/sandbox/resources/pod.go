package resources

import (
	"encoding/json"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// BuildPod returns the sandbox Pod for spec. It is a pure function of its
// arguments, which is what the builder tests pin.
func BuildPod(cfg config.Objects, s api.Spec) *corev1.Pod {
	var env []corev1.EnvVar
	if s.MaxShellSessions > 0 {
		env = append(env, corev1.EnvVar{Name: "MAX_SHELL_SESSIONS", Value: strconv.Itoa(s.MaxShellSessions)})
	}
	env = append(env, requestEnv(s.ID, s.Env)...) // references only: the values are in EnvSecret
	env = append(env, proxyEnv(s.Egress)...)

	tolerations, _ := config.ParseTolerations(cfg.Tolerations) // validated at start-up
	port := cfg.ContainerPort
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(s.ID),
			Namespace:   cfg.Namespace,
			Labels:      Labels(s),
			Annotations: Annotations(s),
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:            containerName,
				Image:           cfg.SandboxImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Ports:           []corev1.ContainerPort{{Name: portName, ContainerPort: port, Protocol: corev1.ProtocolTCP}},
				Env:             env,
				ReadinessProbe:  probe(port, readinessPeriod, 3, 0),
				LivenessProbe:   probe(port, 10, 3, slowStartBudget),
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{
						corev1.ResourceCPU:              minQuantity(resource.MustParse(cfg.CPURequest), s.CPULimit),
						corev1.ResourceMemory:           memoryRequest(cfg.ResourcesConfig, s),
						corev1.ResourceEphemeralStorage: resource.MustParse(cfg.EphemeralStorage),
					},
					Limits: corev1.ResourceList{
						corev1.ResourceCPU:              s.CPULimit,
						corev1.ResourceMemory:           s.MemoryLimit,
						corev1.ResourceEphemeralStorage: resource.MustParse(cfg.EphemeralStorage),
					},
				},
				SecurityContext: containerSecurityContext(cfg.PodSecurityConfig, cfg.CapabilitiesAdd),
			}},
			RestartPolicy:                 corev1.RestartPolicyAlways,
			ActiveDeadlineSeconds:         ptr.To(int64(s.MaxLifetime / time.Second)),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			ServiceAccountName:            cfg.ServiceAccountName,
			NodeSelector:                  cfg.NodeSelector,
			Tolerations:                   tolerations,
			TerminationGracePeriodSeconds: ptr.To(int64(10)),
			SecurityContext:               podSecurityContext(cfg.PodSecurityConfig),
		},
	}
	pod.Labels[keys.LabelPod] = pod.Name // the Service's pin (ServicePin)
	if cfg.UserNamespace {
		pod.Spec.HostUsers = ptr.To(false)
	}
	if cfg.RuntimeClassName != "" {
		pod.Spec.RuntimeClassName = ptr.To(cfg.RuntimeClassName)
	}
	if len(pod.Spec.NodeSelector) == 0 {
		pod.Spec.NodeSelector = nil
	}
	sandboxMounts(cfg.DeerFlowConfig, s).apply(&pod.Spec, &pod.Spec.Containers[0])
	if cfg.ReadOnlyRootFS {
		pod.Spec.Volumes = append(pod.Spec.Volumes, emptyDirVolume("tmp"))
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"})
	}
	addLarkContainers(cfg, s, pod)
	if s.Resolved != nil {
		applyTemplate(cfg.PodSecurityConfig, s.Resolved, pod)
		if s.Resolved.Envd {
			addAgent(cfg, s, pod)
		}
	}
	return pod
}

// proxyEnv points an allowlist sandbox's HTTP clients at the egress proxy,
// by address: the sandbox has no DNS. Both spellings, as curl, pip, Go and
// Python's requests each read one or the other. It is a convenience, not
// the confinement: the NetworkPolicy lets the sandbox reach the proxy
// alone, whatever its code does with these.
func proxyEnv(e api.Egress) []corev1.EnvVar {
	if e.Mode != egress.Allowlist || e.Proxy == "" {
		return nil
	}
	url := "http://" + e.Proxy
	var env []corev1.EnvVar
	for _, name := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		env = append(env, corev1.EnvVar{Name: name, Value: url})
	}
	return env
}

// Annotations are a sandbox workload's bookkeeping.
func Annotations(s api.Spec) map[string]string {
	a := map[string]string{
		keys.AnnotationUserID:       s.UserID,
		keys.AnnotationThreadID:     s.ThreadID,
		keys.AnnotationCreatedAt:    s.Now.Format(time.RFC3339),
		keys.AnnotationLastActivity: s.Now.Format(time.RFC3339),
		keys.AnnotationIdleTimeout:  strconv.FormatInt(int64(s.IdleTimeout/time.Second), 10),
		keys.AnnotationMaxLifetime:  strconv.FormatInt(int64(s.MaxLifetime/time.Second), 10),
		keys.AnnotationExpiresAt:    ExpiresAt(s.Now, s.Now, s.IdleTimeout, s.MaxLifetime).Format(time.RFC3339),
	}
	if s.MaxShellSessions > 0 {
		a[keys.AnnotationMaxShellSessions] = strconv.Itoa(s.MaxShellSessions)
	}
	if len(s.Metadata) > 0 {
		b, _ := json.Marshal(s.Metadata) // a map of strings always marshals
		a[keys.AnnotationMetadata] = string(b)
	}
	return a
}

// expiresAt is the earlier of the idle deadline and the lifetime cap.
func ExpiresAt(created, lastActivity time.Time, idle, lifetime time.Duration) time.Time {
	idleEnd, hardEnd := lastActivity.Add(idle), created.Add(lifetime)
	if idleEnd.Before(hardEnd) {
		return idleEnd
	}
	return hardEnd
}

// The sandbox's probes, both HTTP GET /v1/sandbox. Readiness runs every
// second with no initial delay and no startup probe in front of it: the
// kubelet runs a readiness probe at once whenever it sees the container
// running and not yet Ready, so the Pod turns Ready within milliseconds of
// the sandbox answering (about half a second after the create on the real
// node). A startup probe would gate that on its own first tick, a whole
// period after the kubelet took the Pod (create → Ready 1.1–2 s), and
// DeerFlow's readiness probe waited a fixed 5 s whatever the image. A slow
// image (minutes to start) is simply not Ready yet: readiness never
// restarts a container. Only liveness restarts, so it waits slowStartBudget
// after the container starts before its first check, the budget the
// startup probe used to give. A template may replace either, or add a
// startup probe (templatepod.go).
const (
	readinessPeriod = 1
	slowStartBudget = 300 // seconds
)

func probe(port int32, period, failures, delay int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/v1/sandbox", Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP,
		}},
		InitialDelaySeconds: delay,
		PeriodSeconds:       period, TimeoutSeconds: 3, FailureThreshold: failures, SuccessThreshold: 1,
	}
}

func podSecurityContext(cfg *config.PodSecurityConfig) *corev1.PodSecurityContext {
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

func containerSecurityContext(cfg *config.PodSecurityConfig, add []string) *corev1.SecurityContext {
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

// memoryRequest is the limit itself by default, so that the scheduler
// reserves all a sandbox may use and no sandbox can overcommit its node.
func memoryRequest(cfg *config.ResourcesConfig, s api.Spec) resource.Quantity {
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

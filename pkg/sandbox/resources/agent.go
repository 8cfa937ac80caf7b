package resources

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// The agent's pieces in a sandbox Pod (docs/e2b.md).
const (
	agentVolume    = "envd"
	agentDir       = "/opt/envd"
	agentBinary    = agentDir + "/envd"
	agentInstaller = "envd-install"
	// AgentTokenHashEnv is the variable that gives the agent its token's
	// hash (pkg/envd reads it).
	AgentTokenHashEnv = "ENVD_ACCESS_TOKEN_SHA256"
)

// addAgent puts the envd-compatible agent into the sandbox container of a
// template that asks for it, without touching its image: an init container
// of the agent's image copies its static binary into an emptyDir, and the
// sandbox container starts it from a postStart hook, which runs it beside
// the image's own entrypoint (that stays the container's first process,
// with its own command and user), detached, and returns once it answers.
// The kubelet reports the container running only after the hook, so a
// Ready sandbox's agent answers. The agent gets the hash of the sandbox's
// token, never the token, so whoever reads the Pod cannot call it.
func addAgent(cfg config.Objects, s api.Spec, pod *corev1.Pod) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: agentVolume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))},
	}})
	// Every resource a LimitRange can default is set: a LimitRange that
	// fills one in also annotates the Pod (kubernetes.io/limit-ranger),
	// which the admission policy's annotation allow-list refuses.
	small := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("50m"),
		corev1.ResourceMemory:           resource.MustParse("32Mi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("32Mi"),
	}
	pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{
		Name:            agentInstaller,
		Image:           cfg.EnvdImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/envd", "install", agentBinary},
		VolumeMounts:    []corev1.VolumeMount{{Name: agentVolume, MountPath: agentDir}},
		Resources:       corev1.ResourceRequirements{Requests: small, Limits: small},
		SecurityContext: containerSecurityContext(cfg.PodSecurityConfig, nil),
	})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: agentVolume, MountPath: agentDir, ReadOnly: true})
	c.Env = append(c.Env, corev1.EnvVar{Name: AgentTokenHashEnv, Value: s.EnvdTokenHash})
	c.Ports = append(c.Ports, corev1.ContainerPort{Name: "envd", ContainerPort: keys.EnvdPort, Protocol: corev1.ProtocolTCP})
	if c.Lifecycle == nil {
		c.Lifecycle = &corev1.Lifecycle{}
	}
	c.Lifecycle.PostStart = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{agentBinary, "start"}}}
}

package resources

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// TestAgentIsAddedBesideTheImage: a template with the agent gives its Pod
// exactly the agent's pieces (an init container of the agent's image that
// installs it, its volume mounted read-only, a postStart hook that starts
// it, its token's hash, its port, the label the router's policy selects)
// and changes nothing else: not the image, command or user of the sandbox
// container.
func TestAgentIsAddedBesideTheImage(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_IMAGE": "sandbox:1", "SANDBOX_ENVD_IMAGE": "envd:1"})
	base := &template.Template{Name: "e2b", Kind: template.KindPod, IdleAction: template.IdleDelete,
		Pod: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "operator/image:2", Command: []string{"/entry"}}}}}}
	withAgent := *base
	withAgent.Envd = true
	s := testSpec()
	s.Template, s.Resolved, s.EnvdTokenHash = base.Name, base, "ab12"
	without := BuildPod(cfg.Objects(), s)
	s.Resolved = &withAgent
	with := BuildPod(cfg.Objects(), s)

	small := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi"), corev1.ResourceEphemeralStorage: resource.MustParse("32Mi")}
	want := without.DeepCopy()
	want.Labels[keys.LabelEnvd] = "true"
	want.Spec.Volumes = append(want.Spec.Volumes, corev1.Volume{Name: "envd", VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))}}})
	want.Spec.InitContainers = append(want.Spec.InitContainers, corev1.Container{
		Name: "envd-install", Image: "envd:1", ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{"/envd", "install", "/opt/envd/envd"},
		VolumeMounts:    []corev1.VolumeMount{{Name: "envd", MountPath: "/opt/envd"}},
		Resources:       corev1.ResourceRequirements{Requests: small, Limits: small},
		SecurityContext: containerSecurityContext(cfg.Objects().PodSecurityConfig, nil),
	})
	c := &want.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "envd", MountPath: "/opt/envd", ReadOnly: true})
	c.Env = append(c.Env, corev1.EnvVar{Name: "ENVD_ACCESS_TOKEN_SHA256", Value: "ab12"})
	c.Ports = append(c.Ports, corev1.ContainerPort{Name: "envd", ContainerPort: 49983, Protocol: corev1.ProtocolTCP})
	c.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/opt/envd/envd", "start"}}}}
	if diff := cmp.Diff(want, with); diff != "" {
		t.Errorf("BuildPod with the agent (-want +got):\n%s", diff)
	}
	if got := with.Spec.Containers[0]; got.Image != "operator/image:2" || !cmp.Equal(got.Command, []string{"/entry"}) {
		t.Errorf("the sandbox container's image %q and command %v changed; want the template's", got.Image, got.Command)
	}
	if got := Labels(s)[keys.LabelEnvd]; got != "true" {
		t.Errorf("the sandbox's labels carry %s=%q; want true (the Service's and a ReplicaSet's too)", keys.LabelEnvd, got)
	}
}

// TestEveryContainerSetsWhatALimitRangeDefaults: each container of a
// sandbox Pod, init containers too, sets the requests and limits a
// LimitRange can default (config/900-limitrange.yaml defaults all three).
// A LimitRange that fills one in annotates the Pod
// (kubernetes.io/limit-ranger), and the admission policy's annotation
// allow-list then refuses the Pod: that is how the agent's init container
// was refused on the Knative deployment.
func TestEveryContainerSetsWhatALimitRangeDefaults(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_IMAGE": "sandbox:1", "SANDBOX_ENVD_IMAGE": "envd:1"}).Objects()
	agent := &template.Template{Name: "e2b", Kind: template.KindPod, IdleAction: template.IdleDelete, Envd: true,
		Pod: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "operator/image:2"}}}}}
	withAgent := testSpec()
	withAgent.Template, withAgent.Resolved, withAgent.EnvdTokenHash = agent.Name, agent, "ab12"
	pods := map[string]corev1.PodSpec{
		"no template":               BuildPod(cfg, testSpec()).Spec,
		"a template with the agent": BuildPod(cfg, withAgent).Spec,
		"its warm pool's Pod":       PoolPodTemplate(cfg, PoolSpec(cfg, agent)).Spec,
	}
	for name, spec := range pods {
		if name != "no template" && len(spec.InitContainers) == 0 {
			t.Errorf("%s: no init container; want the agent's, the one this test is about", name)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
				if _, ok := c.Resources.Requests[r]; !ok {
					t.Errorf("%s: container %s requests no %s, which a LimitRange would fill in (and annotate the Pod)", name, c.Name, r)
				}
				if _, ok := c.Resources.Limits[r]; !ok {
					t.Errorf("%s: container %s sets no %s limit, which a LimitRange would fill in (and annotate the Pod)", name, c.Name, r)
				}
			}
		}
	}
}

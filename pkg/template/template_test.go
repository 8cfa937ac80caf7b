package template

import (
	"errors"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// python is the kind of template the issue describes: a sidecar, an NFS
// volume, imagePullSecrets and a node selector.
func python() *corev1.PodTemplate {
	return &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "python", ResourceVersion: "7", Labels: map[string]string{Label: "true"},
			Annotations: map[string]string{AnnotationIdleTimeout: "30m", AnnotationPort: "8080"}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "data"}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{
					{Name: "sandbox", Image: "registry.example/python-sandbox:3.12", Resources: corev1.ResourceRequirements{
						Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi"), "nvidia.com/gpu": resource.MustParse("1")}}},
					{Name: "proxy", Image: "registry.example/egress-proxy:1"},
				},
				Volumes:          []corev1.Volume{{Name: "datasets", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/datasets", ReadOnly: true}}}},
				ImagePullSecrets: []corev1.LocalObjectReference{{Name: "registry-creds"}},
				NodeSelector:     map[string]string{"pool": "sandboxes"},
			},
		},
	}
}

func TestFromPodTemplateAccepts(t *testing.T) {
	pt := python()
	got, err := FromPodTemplate(pt, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	mem := resource.MustParse("2Gi")
	want := &Template{Name: "python", ResourceVersion: "7", Kind: KindPod, IdleTimeout: 30 * time.Minute, IdleAction: IdleDelete,
		PausedTimeout: 24 * time.Hour, Port: 8080, DeerFlowMounts: true, MemoryLimit: &mem, Pod: pt.Template}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// The template is a copy: editing the object later does not change it.
	pt.Template.Spec.Containers[0].Image = "other"
	if got.Pod.Spec.Containers[0].Image != "registry.example/python-sandbox:3.12" {
		t.Error("the template aliases the PodTemplate it was read from")
	}
}

func TestFromPodTemplateRefuses(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*corev1.PodTemplate)
		field  string
	}{
		{"privileged sidecar", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}, "template.spec.containers[1].securityContext.privileged"},
		{"host network", func(p *corev1.PodTemplate) { p.Template.Spec.HostNetwork = true }, "template.spec.hostNetwork/hostPID/hostIPC"},
		{"host path", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		}, "template.spec.volumes[1].hostPath"},
		{"capability off the list", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}
		}, "template.spec.containers[0].securityContext.capabilities.add"},
		{"init container escalates", func(p *corev1.PodTemplate) {
			p.Template.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "x", SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true)}}}
		}, "template.spec.initContainers[0].securityContext.allowPrivilegeEscalation"},
		{"token", func(p *corev1.PodTemplate) { p.Template.Spec.AutomountServiceAccountToken = ptr.To(true) }, "template.spec.automountServiceAccountToken"},
		{"service account", func(p *corev1.PodTemplate) { p.Template.Spec.ServiceAccountName = "admin" }, "template.spec.serviceAccountName"},
		{"host port", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 80}}
		}, "template.spec.containers[0].ports[0].hostPort"},
		{"host users", func(p *corev1.PodTemplate) { p.Template.Spec.HostUsers = ptr.To(true) }, "template.spec.hostUsers"},
		{"root", func(p *corev1.PodTemplate) {
			p.Template.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}
		}, "template.spec.securityContext.runAsUser"},
		{"unconfined", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
		}, "template.spec.containers[0].securityContext.seccompProfile"},
		{"no sandbox container", func(p *corev1.PodTemplate) { p.Template.Spec.Containers[0].Name = "main" }, "template.spec.containers"},
		{"bad kind", func(p *corev1.PodTemplate) { p.Annotations[AnnotationKind] = "Deployment" }, "metadata.annotations[" + AnnotationKind + "]"},
		{"lifetime over the maximum", func(p *corev1.PodTemplate) { p.Annotations[AnnotationMaxLifetime] = "480h" }, "metadata.annotations[" + AnnotationMaxLifetime + "]"},
		{"port the NetworkPolicy does not admit", func(p *corev1.PodTemplate) { p.Annotations[AnnotationPort] = "9000" }, "metadata.annotations[" + AnnotationPort + "]"},
		{"unknown setting", func(p *corev1.PodTemplate) { p.Annotations[annotationPrefix+"kinds"] = "Pod" }, "metadata.annotations[" + annotationPrefix + "kinds]"},
		{"pause on a bare Pod", func(p *corev1.PodTemplate) { p.Annotations[AnnotationIdleAction] = IdlePause }, "metadata.annotations[" + AnnotationIdleAction + "]"},
		{"label the backend's ingress selects", func(p *corev1.PodTemplate) {
			p.Template.Labels["app.kubernetes.io/name"] = "deer-flow-backend"
		}, "template.metadata.labels[app.kubernetes.io/name]"},
		{"label of the sandbox identity", func(p *corev1.PodTemplate) { p.Template.Labels["sandbox-id"] = "other" }, "template.metadata.labels[sandbox-id]"},
		{"apparmor unconfined", func(p *corev1.PodTemplate) {
			p.Template.Annotations = map[string]string{"container.apparmor.security.beta.kubernetes.io/sandbox": "unconfined"}
		}, "template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/sandbox]"},
		{"projected token", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "tok", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "t"}}}}}})
		}, "template.spec.volumes[1].projected.sources[0]"},
		{"gitRepo volume", func(p *corev1.PodTemplate) {
			p.Template.Spec.Volumes = append(p.Template.Spec.Volumes, corev1.Volume{Name: "g", VolumeSource: corev1.VolumeSource{GitRepo: &corev1.GitRepoVolumeSource{Repository: "x"}}})
		}, "template.spec.volumes[1].gitRepo"},
		{"volume name the provisioner uses", func(p *corev1.PodTemplate) { p.Template.Spec.Volumes[0].Name = "host-user" }, "template.spec.volumes[0].name"},
		{"mount over DeerFlow's data", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[1].VolumeMounts = []corev1.VolumeMount{{Name: "datasets", MountPath: "/mnt/user-data/x"}}
		}, "template.spec.containers[1].volumeMounts[0].mountPath"},
		{"field the provisioner controls", func(p *corev1.PodTemplate) { p.Template.Spec.ActiveDeadlineSeconds = ptr.To[int64](1) }, "template.spec.activeDeadlineSeconds"},
		{"dns to another resolver", func(p *corev1.PodTemplate) { p.Template.Spec.DNSPolicy = corev1.DNSDefault }, "template.spec.dnsPolicy"},
		{"probe sent to another host", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Host: "169.254.169.254"}}}
		}, "template.spec.containers[0].startupProbe"},
		{"lifecycle hook", func(p *corev1.PodTemplate) { p.Template.Spec.Containers[1].Lifecycle = &corev1.Lifecycle{} }, "template.spec.containers[1].lifecycle"},
		{"memory over the bound", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("64Gi")
		}, "template.spec.containers[0].resources.limits.memory"},
		{"cpu request", func(p *corev1.PodTemplate) {
			p.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		}, "template.spec.containers[0].resources.requests.cpu"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := python()
			tt.mutate(pt)
			_, err := FromPodTemplate(pt, testConfig(t))
			var te *Error
			if !errors.As(err, &te) {
				t.Fatalf("error %v, want a template error", err)
			}
			if diff := cmp.Diff(Error{Template: "python", Field: tt.field}, Error{Template: te.Template, Field: te.Field}); diff != "" {
				t.Errorf("(-want +got):\n%s\n(%v)", diff, err)
			}
		})
	}
}

package template

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// python is the kind of template the issue describes: a sidecar, an NFS
// volume, imagePullSecrets and a node selector.
func python() *corev1.PodTemplate {
	return &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "python", ResourceVersion: "7", Labels: map[string]string{Label: "true"},
			Annotations: map[string]string{AnnotationIdleTimeout: "30m", AnnotationPort: "9000"}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "data"}},
			Spec: corev1.PodSpec{
				Containers: []corev1.Container{
					{Name: "sandbox", Image: "registry.example/python-sandbox:3.12"},
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
	got, err := FromPodTemplate(pt, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := &Template{Name: "python", ResourceVersion: "7", Kind: KindPod, IdleTimeout: 30 * time.Minute, Port: 9000, DeerFlowMounts: true, Pod: pt.Template}
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
		{"lifetime over the maximum", func(p *corev1.PodTemplate) { p.Annotations[AnnotationMaxLifetime] = "48h" }, "metadata.annotations[" + AnnotationMaxLifetime + "]"},
		{"bad port", func(p *corev1.PodTemplate) { p.Annotations[AnnotationPort] = "0" }, "metadata.annotations[" + AnnotationPort + "]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt := python()
			tt.mutate(pt)
			_, err := FromPodTemplate(pt, 24*time.Hour)
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

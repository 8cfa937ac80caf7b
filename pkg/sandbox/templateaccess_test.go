package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// templated is a Manager of a deployment with env's credentials, and put
// writes a sandbox template of it: named name, its sandbox container's
// image name too, for principals (every principal when ""), with edit's
// changes.
func templated(t *testing.T, env map[string]string) (*Manager, *fake.Clientset, func(name, principals string, edit func(*corev1.PodSpec))) {
	t.Helper()
	client := fake.NewClientset()
	env["SANDBOX_NETWORK_POLICY_ENSURE"] = "true"
	cfg := testConfig(t, env)
	put := func(name, principals string, edit func(*corev1.PodSpec)) {
		pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cfg.Namespace,
			Labels: map[string]string{keys.LabelTemplate: "true"}, Annotations: map[string]string{}},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: name}}}}}
		if principals != "" {
			pt.Annotations[keys.TemplatePrincipals] = principals
		}
		if edit != nil {
			edit(&pt.Template.Spec)
		}
		if _, err := client.CoreV1().PodTemplates(cfg.Namespace).Create(context.Background(), pt, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return NewManager(cfg, client), client, put
}

// homeRW mounts the claim deer-flow-user-data read-write in the sandbox.
func homeRW(spec *corev1.PodSpec) {
	spec.Volumes = []corev1.Volume{{Name: "home", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "deer-flow-user-data"}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "home", MountPath: "/home"}}
}

// templateOutcome is what a create with a template came to.
type templateOutcome struct {
	Image  string // the sandbox container's, when the create succeeded
	Detail string // the refusal's (422), when it did not
}

// createWith creates sandbox id from tmpl as principal, for a user of its own.
func createWith(t *testing.T, m *Manager, client *fake.Clientset, principal, id, tmpl string) templateOutcome {
	t.Helper()
	s := ownerSpec(id)
	s.UserID, s.ThreadID, s.Template = principal+"-user", id, tmpl
	if _, err := m.Create(api.WithCaller(context.Background(), api.Caller{Principal: principal}), s, 0); err != nil {
		if api.KindOf(err) != api.KindInvalid {
			t.Errorf("%s's create with template %q: %v, want 422 or success", principal, tmpl, err)
		}
		return templateOutcome{Detail: api.DetailOf(err)}
	}
	pod, err := client.CoreV1().Pods(m.cfg.Namespace).Get(context.Background(), resources.PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return templateOutcome{Image: pod.Spec.Containers[0].Image}
}

// TestTemplatesAnswerOnlyTheirPrincipals: with two principals, a template
// that names alice is absent for bob, on the create and in the listing: his
// create of it is refused word for word as one of a template that does not
// exist, and writes nothing; a PodTemplate "default" that names alice
// leaves bob the built-in Pod. A template that mounts a claim read-write
// and names no one is refused for everyone.
func TestTemplatesAnswerOnlyTheirPrincipals(t *testing.T) {
	m, client, put := templated(t, map[string]string{
		"PROVISIONER_API_KEY": "the-default-key-0123456789", "PROVISIONER_API_KEYS": "alice=alice-key-0123456789abcdef,bob=bob-key-0123456789abcdef"})
	cfg, bg := m.cfg, context.Background()
	put("alices", "alice", nil)
	put(template.Default, "alice", nil)
	put("shared-home", "", homeRW)
	create := func(principal, id, tmpl string) templateOutcome { return createWith(t, m, client, principal, id, tmpl) }
	absent := create("bob", "b0", "nosuch").Detail
	got := map[string]templateOutcome{
		"alice, alices":      create("alice", "a1", "alices"),
		"alice, default":     create("alice", "a2", ""),
		"bob, alices":        create("bob", "b1", "alices"),
		"bob, default":       create("bob", "b2", ""),
		"alice, shared-home": create("alice", "a3", "shared-home"),
	}
	want := map[string]templateOutcome{
		"alice, alices":      {Image: "alices"},
		"alice, default":     {Image: template.Default},
		"bob, alices":        {Detail: strings.Replace(absent, `"nosuch"`, `"alices"`, 1)},
		"bob, default":       {Image: cfg.SandboxImage},
		"alice, shared-home": {Detail: `sandbox template "shared-home": template.spec.volumes[0]: container "sandbox" mounts the claim "deer-flow-user-data" read-write, and more than one principal may use this template, so each could read and write the others' data there; mount it readOnly, or name one principal in sandbox.deerflow.dev/principals; fix the PodTemplate with kubectl edit podtemplate shared-home`},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("creates (-want +got):\n%s", diff)
	}
	if _, err := client.CoreV1().Pods(cfg.Namespace).Get(bg, resources.PodName("b1"), metav1.GetOptions{}); err == nil {
		t.Error("bob's refused create left its Pod")
	}

	listed := map[string][]string{}
	for _, p := range []string{"alice", "bob"} {
		sums, err := m.Templates(api.WithCaller(bg, api.Caller{Principal: p}))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sums {
			listed[p] = append(listed[p], s.Name)
		}
	}
	if diff := cmp.Diff(map[string][]string{"alice": {"alices", "default", "shared-home"}, "bob": {"default", "shared-home"}}, listed); diff != "" {
		t.Errorf("GET /api/templates by principal (-want +got):\n%s", diff)
	}
}

// TestTemplateMayShareAClaimWithOnePrincipal: in a deployment of one
// principal (DeerFlow's single key) a template that mounts a claim
// read-write serves it, as before.
func TestTemplateMayShareAClaimWithOnePrincipal(t *testing.T) {
	m, client, put := templated(t, map[string]string{"PROVISIONER_API_KEY": "the-default-key-0123456789"})
	put("shared-home", "", homeRW)
	if diff := cmp.Diff(templateOutcome{Image: "shared-home"}, createWith(t, m, client, "default", "d1", "shared-home")); diff != "" {
		t.Errorf("default's create (-want +got):\n%s", diff)
	}
}

package template

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// Deployments, as their authentication variables describe them.
var (
	oneKey  = map[string]string{"PROVISIONER_API_KEY": "default-key-0123456789abcdef"}
	twoKeys = map[string]string{"PROVISIONER_API_KEY": "default-key-0123456789abcdef",
		"PROVISIONER_API_KEYS": "alice=alice-key-0123456789abcdef,bob=bob-key-0123456789abcdef"}
	// grouped: alice and bob act as the group team; default is alone.
	grouped = map[string]string{"PROVISIONER_API_KEY": "default-key-0123456789abcdef",
		"PROVISIONER_API_KEYS": "alice=alice-key-0123456789abcdef,bob=bob-key-0123456789abcdef", "PROVISIONER_PRINCIPAL_GROUPS": "team=alice,bob"}
	// wildcard: every service account of namespace agents may create, each its own principal.
	wildcard = map[string]string{"AUTH_TOKEN_AUDIENCE": "sandboxes", "AUTH_ALLOWED_SUBJECTS": "system:serviceaccount:agents:*"}
)

// withClaim is python with a claim its sandbox container mounts at /home:
// read-write unless the volume or the mount says readOnly.
func withClaim(volumeRO, mountRO bool) *corev1.PodTemplate {
	pt := python()
	spec := &pt.Template.Spec
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "home", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "deer-flow-user-data", ReadOnly: volumeRO}}})
	spec.Containers[0].VolumeMounts = append(spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "home", MountPath: "/home", ReadOnly: mountRO})
	return pt
}

// naming sets pt's principals annotation.
func naming(pt *corev1.PodTemplate, principals string) *corev1.PodTemplate {
	pt.Annotations[keys.TemplatePrincipals] = principals
	return pt
}

// TestTemplatePrincipalsAndSharedStorage: a template names who may use it,
// each name a principal that may create (a group for its members); and a
// template that mounts a claim or an NFS export read-write is refused when
// more than one principal may use it, named or not, while a deployment of
// one principal keeps it.
func TestTemplatePrincipalsAndSharedStorage(t *testing.T) {
	claimRW := `sandbox template "python": template.spec.volumes[1]: container "sandbox" mounts the claim "deer-flow-user-data" read-write, and more than one principal may use this template, so each could read and write the others' data there; mount it readOnly, or name one principal in sandbox.deerflow.dev/principals`
	noSuch := func(entry string) string {
		return `sandbox template "python": metadata.annotations[sandbox.deerflow.dev/principals]: entry ` + entry + ` names no principal that may create sandboxes: want an API key's name, an allowed service account's username, or a PROVISIONER_PRINCIPAL_GROUPS group (a group's member acts as its group: name the group)`
	}
	type result struct {
		Principals []string
		Err        string
	}
	tests := []struct {
		name string
		auth map[string]string // nil: the tenancy unknown (FromPodTemplate)
		pt   *corev1.PodTemplate
		want result
	}{
		{name: "no names: every principal", auth: twoKeys, pt: python(), want: result{}},
		{name: "named principals and a group", auth: grouped, pt: naming(python(), " default , team,default"), want: result{Principals: []string{"default", "team"}}},
		{name: "a service account under a wildcard subject", auth: wildcard, pt: naming(python(), "system:serviceaccount:agents:backend"),
			want: result{Principals: []string{"system:serviceaccount:agents:backend"}}},
		{name: "a service account of another namespace", auth: wildcard, pt: naming(python(), "system:serviceaccount:other:backend"),
			want: result{Principals: []string{"system:serviceaccount:other:backend"}, Err: noSuch("1")}},
		{name: "a group's member, who acts as its group", auth: grouped, pt: naming(python(), "default,alice"),
			want: result{Principals: []string{"default", "alice"}, Err: noSuch("2")}},
		{name: "a name no credential has", auth: twoKeys, pt: naming(python(), "carol"), want: result{Principals: []string{"carol"}, Err: noSuch("1")}},
		{name: "an empty entry", auth: twoKeys, pt: naming(python(), "alice,,bob"), want: result{Principals: []string{"alice", "", "bob"},
			Err: `sandbox template "python": metadata.annotations[sandbox.deerflow.dev/principals]: entry 2 is empty: want principals' names, comma-separated (an API key's name, a service account's username, or a group)`}},
		{name: "unknown tenancy: names as written", pt: naming(python(), "carol"), want: result{Principals: []string{"carol"}}},

		{name: "a claim read-write, one principal in the deployment", auth: oneKey, pt: withClaim(false, false), want: result{}},
		{name: "a claim read-write, two principals in the deployment", auth: twoKeys, pt: withClaim(false, false), want: result{Err: claimRW}},
		{name: "a claim read-write, every account of a namespace", auth: wildcard, pt: withClaim(false, false), want: result{Err: claimRW}},
		{name: "a claim read-write, the tenancy unknown", pt: withClaim(false, false), want: result{Err: claimRW}},
		{name: "a claim read-write, one principal named", auth: twoKeys, pt: naming(withClaim(false, false), "alice"), want: result{Principals: []string{"alice"}}},
		{name: "a claim read-write, one group named", auth: grouped, pt: naming(withClaim(false, false), "team"), want: result{Principals: []string{"team"}}},
		{name: "a claim read-write, two principals named", auth: twoKeys, pt: naming(withClaim(false, false), "alice,bob"),
			want: result{Principals: []string{"alice", "bob"}, Err: claimRW}},
		{name: "a claim read-only by its volume", auth: twoKeys, pt: withClaim(true, false), want: result{}},
		{name: "a claim every container mounts read-only", auth: twoKeys, pt: withClaim(false, true), want: result{}},
		{name: "a claim a sidecar mounts read-write", auth: twoKeys, pt: func() *corev1.PodTemplate {
			pt := withClaim(false, true)
			pt.Template.Spec.Containers[1].VolumeMounts = []corev1.VolumeMount{{Name: "home", MountPath: "/home"}}
			return pt
		}(), want: result{Err: `sandbox template "python": template.spec.volumes[1]: container "proxy" mounts the claim "deer-flow-user-data" read-write, and more than one principal may use this template, so each could read and write the others' data there; mount it readOnly, or name one principal in sandbox.deerflow.dev/principals`}},
		{name: "a claim no container mounts", auth: twoKeys, pt: func() *corev1.PodTemplate {
			pt := withClaim(false, false)
			pt.Template.Spec.Containers[0].VolumeMounts = nil
			return pt
		}(), want: result{}},
		{name: "an NFS export read-write", auth: twoKeys, pt: func() *corev1.PodTemplate {
			pt := python()
			pt.Template.Spec.Volumes[0].NFS.ReadOnly = false
			pt.Template.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "datasets", MountPath: "/data"}}
			return pt
		}(), want: result{Err: `sandbox template "python": template.spec.volumes[0]: container "sandbox" mounts the NFS export nfs.example:/datasets read-write, and more than one principal may use this template, so each could read and write the others' data there; mount it readOnly, or name one principal in sandbox.deerflow.dev/principals`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := configtest.Load(t, tc.auth)
			var ten Tenancy
			if tc.auth != nil {
				ten = TenancyOf(&cfg.AuthConfig)
			}
			tmpl, err := FromPodTemplateIn(tc.pt, cfg.Objects(), ten)
			var got result
			switch {
			case err != nil:
				var te *Error
				if !errors.As(err, &te) {
					t.Fatalf("error %v: want a refused template (*Error)", err)
				}
				got = result{Principals: principalsOf(tc.pt), Err: err.Error()}
			default:
				got.Principals = tmpl.Principals
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestStoreShowsATemplateOnlyToItsPrincipals: a principal a template does
// not name finds it absent, on every path a template is found by name or
// listed, from the watch or read on demand: a create of it is refused as
// for a template that does not exist (word for word, so it learns nothing),
// the listing leaves it out, and a PodTemplate "default" it may not use
// leaves it the built-in Pod. A refused template's error is listed only to
// the principals it names.
func TestStoreShowsATemplateOnlyToItsPrincipals(t *testing.T) {
	template := func(name, principals string) *corev1.PodTemplate {
		pt := python()
		pt.Name, pt.Namespace = name, "ns"
		if principals != "" {
			pt.Annotations[keys.TemplatePrincipals] = principals
		}
		return pt
	}
	broken := template("broken", "alice")
	broken.Template.Spec.HostNetwork = true
	objects := []*corev1.PodTemplate{template("python", ""), template("alices", "alice"), template(Default, "alice"), broken}

	type found struct {
		Template string // the name of what GetFor returned; "built-in" for nil
		Err      string
	}
	type view struct {
		Get  map[string]found // by the name asked for
		List []string         // name, and "!" when listed with an error
	}
	// absent is what a template's absence reads as: the answer of a Store
	// that holds no such template.
	absent := func(name string) found {
		_, err := storeFor(t, fake.NewClientset()).GetFor(context.Background(), name, "bob")
		return found{Err: err.Error()}
	}
	tests := []struct {
		principal string
		want      view
	}{{
		principal: "alice",
		want: view{Get: map[string]found{"python": {Template: "python"}, "alices": {Template: "alices"}, "": {Template: Default},
			"broken": {Err: `sandbox template "broken": template.spec.hostNetwork/hostPID/hostIPC: a sandbox never shares the node's namespaces`}},
			List: []string{"alices", "broken!", Default, "python"}},
	}, {
		principal: "bob",
		want: view{Get: map[string]found{"python": {Template: "python"}, "alices": absent("alices"), "": {Template: "built-in"}, "broken": absent("broken")},
			List: []string{Default + " (built-in)", "python"}},
	}}
	for _, watched := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cs := fake.NewClientset()
		for _, pt := range objects {
			if _, err := cs.CoreV1().PodTemplates("ns").Create(ctx, pt, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		s := storeFor(t, cs)
		if watched {
			s.Run(ctx)
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
				return s.HasSynced(), nil
			}); err != nil {
				t.Fatalf("the watch never synced: %v", err)
			}
		}
		for _, tc := range tests {
			got := view{Get: map[string]found{}}
			for name := range tc.want.Get {
				tmpl, err := s.GetFor(ctx, name, tc.principal)
				f := found{Template: "built-in"}
				if tmpl != nil {
					f.Template = tmpl.Name
				}
				if err != nil {
					f = found{Err: err.Error()}
				}
				got.Get[name] = f
			}
			sums, valid, err := s.ListValidFor(ctx, tc.principal)
			if err != nil {
				t.Fatal(err)
			}
			for _, sum := range sums {
				switch {
				case sum.Error != "":
					got.List = append(got.List, sum.Name+"!")
				case sum.BuiltIn:
					got.List = append(got.List, sum.Name+" (built-in)")
				default:
					got.List = append(got.List, sum.Name)
				}
			}
			for _, v := range valid {
				if !v.Allows(tc.principal) {
					t.Errorf("%s: ListValidFor returned %q, which it may not use", tc.principal, v.Name)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s, watched %v (-want +got):\n%s", tc.principal, watched, diff)
			}
		}
	}
}

package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// requestEnv is a request's env whose values no object but its Secret may hold.
var requestEnv = map[string]string{"OPENAI_API_KEY": "sk-live-5e1d0c", "REGION": "eu-$(HOME)"}

// writesOf lists the writes of sandbox objects among actions, as "verb
// resource".
func writesOf(actions []k8stesting.Action) []string {
	var out []string
	for _, a := range actions {
		sandboxObject := slices.Contains([]string{"services", "secrets", "pods", "replicasets"}, a.GetResource().Resource)
		if v := a.GetVerb(); sandboxObject && v != "get" && v != "list" && v != "watch" {
			out = append(out, v+" "+a.GetResource().Resource)
		}
	}
	return out
}

// TestCreateKeepsEnvInItsSecret: a create with env
// writes the values into the sandbox's own Secret, owned by its Service
// (its slot, by UID) and written before the workload, which takes each
// variable by reference; a create without env (DeerFlow's) writes what it
// always did, and reads no Secret either. A Secret of the name left by a
// sandbox whose Service is gone is replaced, another Secret of the name is
// never touched, no Secret is ever read, and a create that fails removes its Secret with the rest.
func TestCreateKeepsEnvInItsSecret(t *testing.T) {
	type outcome struct {
		Kind    api.Kind // -1: no error
		Writes  []string
		Objects []string // what is left: Pods and Services (objectsLeft), then Secrets
	}
	id := "env1"
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: resources.EnvSecretName(id), Namespace: "deer-flow"},
		Data: map[string][]byte{"TOKEN": []byte("someone else's")}}
	tests := []struct {
		name string
		env  map[string]string
		kind string // the template's kind; "" for none (a bare Pod)
		// before writes what the create finds.
		before func(t *testing.T, client *fake.Clientset, cfg *config.Config, s api.Spec)
		// fault is added before the create runs.
		fault func(client *fake.Clientset, cancel context.CancelFunc)
		want  outcome
	}{{
		name: "no env: the writes of today, no Secret",
		want: outcome{Kind: -1, Writes: []string{"create services", "create pods"},
			Objects: []string{"Pod sandbox-env1", "Service sandbox-env1-svc"}},
	}, {
		name: "env: the Secret between the slot and the Pod",
		env:  requestEnv,
		want: outcome{Kind: -1, Writes: []string{"create services", "create secrets", "create pods"},
			Objects: []string{"Pod sandbox-env1", "Service sandbox-env1-svc", "Secret sandbox-env1-env"}},
	}, {
		name: "env on a ReplicaSet template: the Secret before the ReplicaSet",
		env:  requestEnv, kind: template.KindReplicaSet,
		want: outcome{Kind: -1, Writes: []string{"create services", "create secrets", "create replicasets", "update services"},
			Objects: []string{"Service sandbox-env1-svc", "Secret sandbox-env1-env"}},
	}, {
		name: "a Secret of the id's Service gone (the GC not there yet): replaced",
		env:  requestEnv,
		before: func(t *testing.T, client *fake.Clientset, cfg *config.Config, s api.Spec) {
			stale := resources.EnvSecret(cfg.Objects(), s, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: resources.ServiceName(id), UID: "uid-gone"}})
			stale.Data = map[string][]byte{"OPENAI_API_KEY": []byte("an older sandbox's")}
			if _, err := client.CoreV1().Secrets("deer-flow").Create(context.Background(), stale, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		want: outcome{Kind: -1, Writes: []string{"create services", "create secrets", "delete secrets", "create secrets", "create pods"},
			Objects: []string{"Pod sandbox-env1", "Service sandbox-env1-svc", "Secret sandbox-env1-env"}},
	}, {
		name: "a Secret of the name that is not a sandbox's: 409, left alone, nothing else left",
		env:  requestEnv,
		before: func(t *testing.T, client *fake.Clientset, _ *config.Config, _ api.Spec) {
			if _, err := client.CoreV1().Secrets("deer-flow").Create(context.Background(), foreign.DeepCopy(), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		want: outcome{Kind: api.KindConflict, Writes: []string{"create services", "create secrets", "delete secrets", "delete services"},
			Objects: []string{"Secret sandbox-env1-env"}},
	}, {
		name: "the Pod refused (4xx): the slot and the Secret go",
		env:  requestEnv,
		fault: func(client *fake.Clientset, _ context.CancelFunc) {
			client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewBadRequest("refused")
			})
		},
		want: outcome{Kind: api.KindInternal, Writes: []string{"create services", "create secrets", "create pods", "delete services", "delete secrets"}},
	}, {
		name: "a ReplicaSet's bind refused: the ReplicaSet, the slot and the Secret go",
		env:  requestEnv, kind: template.KindReplicaSet,
		fault: func(client *fake.Clientset, _ context.CancelFunc) {
			client.PrependReactor("update", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewBadRequest("refused")
			})
		},
		want: outcome{Kind: api.KindInternal, Writes: []string{"create services", "create secrets", "create replicasets", "update services", "delete replicasets", "delete services", "delete secrets"}},
	}, {
		name: "the client gone after the last write (the Pod's): the undo removes the Secret too",
		env:  requestEnv,
		fault: func(client *fake.Clientset, cancel context.CancelFunc) {
			client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				cancel()
				return false, nil, nil
			})
		},
		want: outcome{Kind: api.KindUnavailable, Writes: []string{"create services", "create secrets", "create pods", "delete pods", "delete services", "delete secrets"}},
	}, {
		name: "a half-made Pod with env repaired: its Secret is back",
		env:  requestEnv,
		before: func(t *testing.T, client *fake.Clientset, cfg *config.Config, s api.Spec) {
			s.Token = token.New()
			if _, err := client.CoreV1().Pods("deer-flow").Create(context.Background(), resources.BuildPodFor(cfg.Objects(), s), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		want: outcome{Kind: -1, Writes: []string{"create services", "create secrets", "create pods", "patch pods", "update services"},
			Objects: []string{"Pod sandbox-env1", "Service sandbox-env1-svc", "Secret sandbox-env1-env"}},
	}, {
		name: "a half-made Pod without env repaired: the values are not kept",
		env:  requestEnv,
		before: func(t *testing.T, client *fake.Clientset, cfg *config.Config, s api.Spec) {
			s.Token, s.Env = token.New(), nil
			if _, err := client.CoreV1().Pods("deer-flow").Create(context.Background(), resources.BuildPodFor(cfg.Objects(), s), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		},
		want: outcome{Kind: -1, Writes: []string{"create services", "create secrets", "create pods", "patch pods", "delete secrets", "update services"},
			Objects: []string{"Pod sandbox-env1", "Service sandbox-env1-svc"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, nil)
			client := fake.NewClientset(sharedPolicies(cfg)...)
			apiServerWrites(t, client)
			admissionDeletesEnvSecretsOnly(client)
			m := NewManager(cfg, client)
			ctx, cancel := context.WithCancel(api.WithCaller(context.Background(), api.Caller{Principal: "alice"}))
			defer cancel()
			s := ownerSpec(id)
			s.Caller, s.Env = api.Caller{Principal: "alice"}, tc.env
			if tc.kind != "" {
				s.Template = "healing"
				pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: s.Template, Namespace: cfg.Namespace,
					Labels: map[string]string{keys.LabelTemplate: "true"}, Annotations: map[string]string{keys.TemplateKind: tc.kind}},
					Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: "sandbox"}}}}}
				if _, err := client.CoreV1().PodTemplates(cfg.Namespace).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.before != nil {
				tc.before(t, client, cfg, s)
			}
			if tc.fault != nil {
				tc.fault(client, cancel)
			}
			client.ClearActions()
			_, err := m.Create(ctx, s, 0)
			got := outcome{Kind: -1, Writes: writesOf(client.Actions()), Objects: objectsLeft(t, client)}
			for _, a := range client.Actions() {
				if v := a.GetVerb(); a.GetResource().Resource == "secrets" && (v == "get" || v == "list" || v == "watch") {
					t.Errorf("the create read Secrets (%s): the function's Role grants no read", v)
				}
			}
			if err != nil {
				got.Kind = api.KindOf(err)
			}
			secrets, lerr := client.CoreV1().Secrets("deer-flow").List(context.Background(), metav1.ListOptions{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			for _, sec := range secrets.Items {
				got.Objects = append(got.Objects, "Secret "+sec.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("create (-want +got):\n%s\nerror: %v", diff, err)
			}
			if err != nil {
				if tc.want.Kind == api.KindConflict {
					if sec, gerr := client.CoreV1().Secrets("deer-flow").Get(context.Background(), foreign.Name, metav1.GetOptions{}); gerr != nil || !cmp.Equal(sec.Data, foreign.Data) {
						t.Errorf("the foreign Secret was changed: %v %v", sec, gerr)
					}
				}
				return
			}
			checkEnvHeldBySecret(t, client, id, tc.env, slices.Contains(tc.want.Objects, "Secret "+resources.EnvSecretName(id)))
		})
	}
}

// admissionDeletesEnvSecretsOnly stands in for the delete rule of
// config/800-admission-policy.yaml that the fake clientset does not run
// (TestAdmissionPinsEnvSecrets runs the policy itself on the real API
// server): a Secret delete is refused unless the Secret is a sandbox's env
// Secret, sandbox-<id>-env labelled with that id, app=deer-flow-sandbox and
// managed by the provisioner.
func admissionDeletesEnvSecretsOnly(client *fake.Clientset) {
	client.PrependReactor("delete", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		o, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), d.GetNamespace(), d.GetName())
		if err != nil {
			return false, nil, nil // not found: the tracker answers
		}
		l := o.(*corev1.Secret).Labels
		id := l[keys.LabelID]
		if id != "" && d.GetName() == resources.EnvSecretName(id) && l[keys.LabelApp] == keys.LabelAppValue && l[keys.LabelManagedBy] == keys.ManagedByValue {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), d.GetName(), errors.New("ValidatingAdmissionPolicy 'sandbox-provisioner-deletes' denied request"))
	})
}

// checkEnvHeldBySecret: no Pod or ReplicaSet holds an env value, and the
// Secret, when there is one (held), holds them all and is owned by the
// id's Service as it is now.
func checkEnvHeldBySecret(t *testing.T, client *fake.Clientset, id string, env map[string]string, held bool) {
	t.Helper()
	bg := context.Background()
	pods, err := client.CoreV1().Pods("deer-flow").List(bg, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rss, err := client.AppsV1().ReplicaSets("deer-flow").List(bg, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal([]any{pods, rss})
	for name, v := range env {
		if strings.Contains(string(raw), v) {
			t.Errorf("a workload holds the value of %s", name)
		}
	}
	if !held {
		return
	}
	svc, err := client.CoreV1().Services("deer-flow").Get(bg, resources.ServiceName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec, err := client.CoreV1().Secrets("deer-flow").Get(bg, resources.EnvSecretName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for k, v := range env {
		want[k] = []byte(v)
	}
	if diff := cmp.Diff(want, sec.Data); diff != "" {
		t.Errorf("the env Secret's data (-want +got):\n%s", diff)
	}
	if !resources.EnvSecretOwnedBy(sec, svc.UID) {
		t.Errorf("the env Secret is owned by %+v, not the sandbox's Service %s", sec.OwnerReferences, svc.UID)
	}
}

//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

const secretPolicy = "sandbox-provisioner-secrets"

// envValues are request env values that only the sandbox's env Secret may
// hold: no Pod, ReplicaSet, Event, log line or answer.
var envValues = map[string]string{"OPENAI_API_KEY": "sk-e2e-3b9f1c7d", "REGION": "eu-$(HOME)-$$"}

// holdsNoEnvValue fails t for each env value found in what (marshalled).
func holdsNoEnvValue(t *testing.T, where string, what any) {
	t.Helper()
	raw, ok := what.(string)
	if !ok {
		b, err := json.Marshal(what)
		if err != nil {
			t.Fatal(err)
		}
		raw = string(b)
	}
	for name, v := range envValues {
		if strings.Contains(raw, v) {
			t.Errorf("%s holds the value of %s", where, name)
		}
	}
}

// TestEnvLivesInItsSecret (issue 45 finding 8), on the real API server: a
// create with env, through every door (HTTP, POST /, a CloudEvent), for a
// bare Pod and a ReplicaSet template, writes the values into the Secret
// sandbox-<id>-env alone, owned by the sandbox's Service; the workload
// takes each variable by reference, and no Pod, ReplicaSet, Kubernetes
// Event, answer or log line holds a value. The Secret goes with the
// sandbox (the garbage collector, through its Service); a create without
// env writes none.
func TestEnvLivesInItsSecret(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	applyTemplates(t, ns, "self-healing")
	f := start(t, ns, map[string]string{"LOG_LEVEL": "debug"})
	ctx := context.Background()
	key := map[string]string{"X-API-Key": function.Key}
	doors := []struct {
		id, template string
		send         func(body map[string]any) function.Response
	}{
		{id: "env-http", send: func(body map[string]any) function.Response { return mustDo(t, f, "POST", "/api/sandboxes", body) }},
		{id: "env-rs", template: "self-healing", send: func(body map[string]any) function.Response { return mustDo(t, f, "POST", "/api/sandboxes", body) }},
		{id: "env-invoke", send: func(body map[string]any) function.Response {
			body["operation"] = "create"
			r, err := f.DoWithHeaders("POST", "/", body, key)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
		{id: "env-event", send: func(body map[string]any) function.Response {
			raw, _ := json.Marshal(body)
			r, err := f.DoWithHeaders("POST", "/", string(raw), map[string]string{"X-API-Key": function.Key, "Content-Type": "application/json",
				"Ce-Specversion": "1.0", "Ce-Id": uuid.NewString(), "Ce-Source": "/e2e", "Ce-Type": events.TypeCreate})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
	}
	for _, d := range doors {
		body := map[string]any{"sandbox_id": d.id, "env": envValues}
		if d.template != "" {
			body["template"] = d.template
		}
		r := d.send(body)
		expectCode(t, r, 200, "create "+d.id+" with env")
		holdsNoEnvValue(t, "the answer to the create of "+d.id, r.Raw)

		svc, err := client().CoreV1().Services(ns).Get(ctx, resources.ServiceName(d.id), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec, err := client().CoreV1().Secrets(ns).Get(ctx, resources.EnvSecretName(d.id), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the env Secret of %s: %v", d.id, err)
		}
		for name, v := range envValues {
			if string(sec.Data[name]) != v {
				t.Errorf("%s's env Secret holds %s=%q, want the value as sent", d.id, name, sec.Data[name])
			}
		}
		if !resources.EnvSecretOwnedBy(sec, svc.UID) || !ptr.Deref(sec.Immutable, false) || sec.Type != corev1.SecretTypeOpaque {
			t.Errorf("%s's env Secret: owners %+v, immutable %v, type %s; want owned by its Service %s, immutable, Opaque", d.id, sec.OwnerReferences, sec.Immutable, sec.Type, svc.UID)
		}
		var ps []corev1.Pod
		eventually(t, 30*time.Second, "a Pod of "+d.id, func() (bool, error) {
			ps = pods(t, ns, "sandbox-id="+d.id)
			return len(ps) > 0, nil
		})
		for _, p := range ps {
			holdsNoEnvValue(t, "Pod "+p.Name, p)
			if !resources.UsesEnvSecret(&p.Spec, d.id) {
				t.Errorf("Pod %s does not take its env from %s: %+v", p.Name, sec.Name, p.Spec.Containers[0].Env)
			}
		}
		if d.template != "" {
			rs, err := client().AppsV1().ReplicaSets(ns).Get(ctx, resources.PodName(d.id), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			holdsNoEnvValue(t, "ReplicaSet "+rs.Name, rs)
		}
	}
	// DeerFlow's create (no env) writes no Secret.
	create(t, f, map[string]any{"sandbox_id": "env-none"})
	if _, err := client().CoreV1().Secrets(ns).Get(ctx, resources.EnvSecretName("env-none"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a create without env wrote an env Secret: %v", err)
	}
	// A create again (DeerFlow creates on every reuse) keeps the one Secret.
	before, err := client().CoreV1().Secrets(ns).Get(ctx, resources.EnvSecretName("env-http"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	create(t, f, map[string]any{"sandbox_id": "env-http", "env": envValues})
	if after, err := client().CoreV1().Secrets(ns).Get(ctx, before.Name, metav1.GetOptions{}); err != nil || after.UID != before.UID {
		t.Errorf("a create of an existing sandbox replaced its env Secret: %v", err)
	}

	evs, err := client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holdsNoEnvValue(t, "the namespace's Events", evs)

	// The Secret goes with its sandbox, through the garbage collector.
	for _, d := range doors {
		expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/"+d.id, nil), 200, "destroy "+d.id)
	}
	for _, d := range doors {
		eventually(t, 60*time.Second, "the env Secret of "+d.id+" gone with its sandbox", func() (bool, error) {
			_, err := client().CoreV1().Secrets(ns).Get(ctx, resources.EnvSecretName(d.id), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
	}
	logs, err := os.ReadFile(f.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	holdsNoEnvValue(t, "the function's log", string(logs))
}

// TestAdmissionPinsEnvSecrets: as the provisioner's
// ServiceAccount, on the real API server, a sandbox (a Pod, a ReplicaSet's
// Pod template) may reference its own env Secret and no other; the only
// Secret the ServiceAccount may create is a sandbox's env Secret as the
// function builds it, and the only Secret it may delete; it may not list
// Secrets, nor read one by name (another sandbox's env Secret, the API
// keys'). Each refusal beside its positive control.
func TestAdmissionPinsEnvSecrets(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	eventually(t, 30*time.Second, secretPolicy+" type-checked", func() (bool, error) {
		p, err := client().AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, secretPolicy, metav1.GetOptions{})
		if err != nil || p.Status.ObservedGeneration != p.Generation {
			return false, err
		}
		if tc := p.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
			t.Fatalf("%s does not type-check: %+v", secretPolicy, tc.ExpressionWarnings)
		}
		return true, nil
	})
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	a := newAdmission(t, ns, nil)
	withEnv := &api.CreateRequest{Env: api.Env{"OPENAI_API_KEY": "x"}}

	// References: the sandbox's own env Secret, and no other.
	refTo := func(name string) func(c *corev1.Container) {
		return func(c *corev1.Container) {
			for i := range c.Env {
				if c.Env[i].ValueFrom != nil && c.Env[i].ValueFrom.SecretKeyRef != nil {
					c.Env[i].ValueFrom.SecretKeyRef.Name = name
				}
			}
		}
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*corev1.Container)
		refused bool
	}{
		{name: "its own env Secret", mutate: func(*corev1.Container) {}},
		{name: "another sandbox's env Secret", mutate: refTo(resources.EnvSecretName("e2")), refused: true},
		{name: "the provisioner's API keys", mutate: refTo("sandbox-provisioner"), refused: true},
		{name: "its own env Secret wholesale (envFrom)", mutate: func(c *corev1.Container) {
			c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: resources.EnvSecretName("e1")}}}}
		}, refused: true},
	} {
		t.Run("Pod: "+tc.name, func(t *testing.T) {
			pod := a.pod("e1", withEnv)
			tc.mutate(&pod.Spec.Containers[0])
			_, err := sa.CoreV1().Pods(ns).Create(ctx, pod, dry)
			if tc.refused != refusedBy(err, podPolicy, "environment from Secrets") || !tc.refused && err != nil {
				t.Errorf("create: %v, want refused %v", err, tc.refused)
			}
		})
		t.Run("ReplicaSet: "+tc.name, func(t *testing.T) {
			rs := a.replicaSet("e1", withEnv)
			tc.mutate(&rs.Spec.Template.Spec.Containers[0])
			_, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry)
			if tc.refused != refusedBy(err, rsPolicy, "environment from Secrets") || !tc.refused && err != nil {
				t.Errorf("create: %v, want refused %v", err, tc.refused)
			}
		})
	}

	// The Secrets the ServiceAccount may create, owned by a Service that
	// exists (the garbage collector removes a Secret whose owner does not,
	// which would take the delete row's object before it is deleted).
	owner, err := client().CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: resources.ServiceName("e1")},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 8080}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	built := func() *corev1.Secret {
		s := a.spec("e1", withEnv, "")
		return resources.EnvSecret(a.cfg.Objects(), s, owner)
	}
	for _, tc := range []struct {
		name    string
		mutate  func(*corev1.Secret)
		message string // "" for admitted
	}{
		{name: "as the function builds it", mutate: func(*corev1.Secret) {}},
		{name: "another name", mutate: func(s *corev1.Secret) { s.Name = "sandbox-provisioner-2" }, message: "only sandboxes' env Secrets"},
		{name: "another id's name", mutate: func(s *corev1.Secret) { s.Name = resources.EnvSecretName("e2") }, message: "only sandboxes' env Secrets"},
		{name: "not managed by the provisioner", mutate: func(s *corev1.Secret) { delete(s.Labels, "app.kubernetes.io/managed-by") }, message: "only sandboxes' env Secrets"},
		{name: "no owner", mutate: func(s *corev1.Secret) { s.OwnerReferences = nil }, message: "owned by its Service"},
		{name: "owned by a Pod", mutate: func(s *corev1.Secret) { s.OwnerReferences[0].Kind = "Pod" }, message: "owned by its Service"},
		{name: "owned by another sandbox's Service", mutate: func(s *corev1.Secret) { s.OwnerReferences[0].Name = resources.ServiceName("e2") }, message: "owned by its Service"},
		{name: "mutable", mutate: func(s *corev1.Secret) { s.Immutable = nil }, message: "Opaque and immutable"},
		{name: "a pull Secret", mutate: func(s *corev1.Secret) {
			s.Type = corev1.SecretTypeDockerConfigJson
			s.Data = map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}
		}, message: "Opaque and immutable"},
	} {
		t.Run("Secret: "+tc.name, func(t *testing.T) {
			s := built()
			tc.mutate(s)
			_, err := sa.CoreV1().Secrets(ns).Create(ctx, s, dry)
			if tc.message == "" && err != nil || tc.message != "" && !refusedBy(err, secretPolicy, tc.message) {
				t.Errorf("create: %v, want refused %q", err, tc.message)
			}
		})
	}

	// Deletes: its own env Secret, no other Secret (made by the operator).
	own, err := sa.CoreV1().Secrets(ns).Create(ctx, built(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating an env Secret as the ServiceAccount: %v", err)
	}
	for _, other := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "operators-own", Namespace: ns}},
		{ObjectMeta: metav1.ObjectMeta{Name: resources.EnvSecretName("e3"), Namespace: ns, Labels: map[string]string{"app": "deer-flow-sandbox", "sandbox-id": "e3"}}},
	} {
		if _, err := client().CoreV1().Secrets(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := sa.CoreV1().Secrets(ns).Delete(ctx, other.Name, metav1.DeleteOptions{}); !refusedBy(err, deletePolicy, "the provisioner deletes only sandboxes") || !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			// envsecret.Secrets.Ensure takes a 403 or 422 as this refusal.
			t.Errorf("deleting Secret %s as the ServiceAccount: %v, want refused by %s", other.Name, err, deletePolicy)
		}
	}
	if err := sa.CoreV1().Secrets(ns).Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting its own env Secret as the ServiceAccount: %v", err)
	}
	if _, err := sa.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets as the ServiceAccount: %v, want Forbidden", err)
	}

	// Reads: none. Another sandbox's env Secret and the API keys' Secret,
	// both there, are Forbidden by name; the positive control is a read the
	// Role grants (the sandbox's Service) by the same client.
	keysSecret, err := client().CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-provisioner"},
		StringData: map[string]string{"api-key": "not-a-real-key-0123456789"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := client().CoreV1().Secrets(ns).Create(ctx, resources.EnvSecret(a.cfg.Objects(), a.spec("e4", withEnv, ""), owner), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.CoreV1().Services(ns).Get(ctx, owner.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("reading a sandbox's Service as the ServiceAccount (the control): %v", err)
	}
	for _, name := range []string{other.Name, keysSecret.Name} {
		if _, err := sa.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("reading Secret %s as the ServiceAccount: %v, want Forbidden", name, err)
		}
	}
}

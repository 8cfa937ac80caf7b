// Package manifests checks config/ with Knative's own Go types, so a manifest
// Knative would refuse (or warn about) fails here, not at deploy time.
package manifests

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	eventingv1 "knative.dev/eventing/pkg/apis/eventing/v1"
	sourcesv1 "knative.dev/eventing/pkg/apis/sources/v1"
	"knative.dev/pkg/apis"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
)

// decode reads the one object in a config/ file.
func decode(t *testing.T, name string, into any) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "config", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// validated is what Knative's own types say of an object, at error and at
// warning level.
type validated interface {
	SetDefaults(context.Context)
	Validate(context.Context) *apis.FieldError
}

func knativeAccepts(t *testing.T, name string, obj validated) {
	t.Helper()
	ctx := apis.WithinCreate(context.Background())
	obj.SetDefaults(ctx)
	fe := obj.Validate(ctx)
	if errs := fe.Filter(apis.ErrorLevel); errs != nil {
		t.Errorf("Knative refuses config/%s: %v", name, errs)
	}
	if warns := fe.Filter(apis.WarningLevel); warns != nil {
		t.Errorf("Knative warns about config/%s: %v", name, warns)
	}
}

// TestEventSendersCarryTheAudience: every Trigger and the PingSource send
// their events with an OIDC token for the function's audience, the one
// 400-service.yaml configures, and Knative's types accept them so.
func TestEventSendersCarryTheAudience(t *testing.T) {
	var svc servingv1.Service
	decode(t, "400-service.yaml", &svc)
	env := map[string]string{}
	for _, e := range svc.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	audience := env["AUTH_TOKEN_AUDIENCE"]
	if audience == "" {
		t.Fatal("400-service.yaml sets no AUTH_TOKEN_AUDIENCE")
	}
	allowed := strings.Split(env["AUTH_ALLOWED_SUBJECTS"], ",")
	operations, err := config.ParsePrincipalOperations(env["PROVISIONER_PRINCIPAL_OPERATIONS"])
	if err != nil {
		t.Fatalf("400-service.yaml: PROVISIONER_PRINCIPAL_OPERATIONS: %v", err)
	}
	if _, ok := operations["*"]; ok {
		t.Error("400-service.yaml narrows every principal (\"*\"): the agent backend's key would lose operations")
	}
	triggers, _ := filepath.Glob(filepath.Join("..", "..", "config", "500-trigger-*.yaml"))
	if len(triggers) != 7 {
		t.Fatalf("%d Triggers in config/, want 7 (create, get, list, destroy, pause, resume, reap)", len(triggers))
	}
	for _, file := range triggers {
		var tr eventingv1.Trigger
		name := filepath.Base(file)
		decode(t, name, &tr)
		knativeAccepts(t, name, &tr)
		if a := tr.Spec.Subscriber.Audience; a == nil || *a != audience {
			t.Errorf("%s: subscriber.audience = %v, want %q", name, a, audience)
		}
		// Knative names a Trigger's OIDC identity <trigger>-oidc-<group>-<kind>.
		subject := "system:serviceaccount:" + tr.Namespace + ":" + tr.Name + "-oidc-eventing.knative.dev-trigger"
		if !slices.Contains(allowed, subject) {
			t.Errorf("%s: its OIDC subject %s is not in AUTH_ALLOWED_SUBJECTS", name, subject)
		}
		// Least privilege: the Trigger's identity may run its own operation
		// and nothing else.
		own := strings.TrimPrefix(tr.Spec.Filter.Attributes["type"], "dev.deerflow.sandbox.")
		if diff := cmp.Diff([]string{own}, operations[subject]); diff != "" {
			t.Errorf("%s: PROVISIONER_PRINCIPAL_OPERATIONS for %s (-want +got):\n%s", name, subject, diff)
		}
	}
	var ping sourcesv1.PingSource
	decode(t, "600-pingsource.yaml", &ping)
	knativeAccepts(t, "600-pingsource.yaml", &ping)
	if a := ping.Spec.Sink.Audience; a == nil || *a != audience {
		t.Errorf("600-pingsource.yaml: sink.audience = %v, want %q", a, audience)
	}
	subject := "system:serviceaccount:" + ping.Namespace + ":" + ping.Name + "-oidc-sources.knative.dev-pingsource"
	if !slices.Contains(allowed, subject) {
		t.Errorf("the PingSource's OIDC subject %s is not in AUTH_ALLOWED_SUBJECTS", subject)
	}
	if diff := cmp.Diff([]string{"reap"}, operations[subject]); diff != "" {
		t.Errorf("the PingSource's subject may run (-want +got):\n%s", diff)
	}
	if len(operations) != len(allowed) {
		t.Errorf("PROVISIONER_PRINCIPAL_OPERATIONS lists %d principals, AUTH_ALLOWED_SUBJECTS %d: every allowed subject needs its operations", len(operations), len(allowed))
	}
	for _, e := range svc.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "EVENTS_TRUST_NETWORK" || (e.Name == "PROVISIONER_API_KEY" && e.ValueFrom == nil) {
			t.Errorf("400-service.yaml sets %s, a trust switch or a literal credential", e.Name)
		}
		if e.Name == "PROVISIONER_API_KEY" && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional {
			t.Error("400-service.yaml marks the API key's Secret optional")
		}
		if e.Name == "PROVISIONER_API_KEYS" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "sandbox-provisioner") {
			t.Error("400-service.yaml must take PROVISIONER_API_KEYS from the sandbox-provisioner Secret")
		}
	}
}

func TestKnativeServiceValidates(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "config", "400-service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var svc servingv1.Service
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&svc); err != nil {
		t.Fatal(err)
	}
	ctx := apis.WithinCreate(context.Background())
	svc.SetDefaults(ctx)
	fe := svc.Validate(ctx)
	if errs := fe.Filter(apis.ErrorLevel); errs != nil {
		t.Errorf("Knative refuses config/400-service.yaml: %v", errs)
	}
	if warns := fe.Filter(apis.WarningLevel); warns != nil {
		t.Errorf("Knative warns about config/400-service.yaml: %v", warns)
	}
	if svc.Spec.Template.Spec.ServiceAccountName != "sandbox-provisioner" {
		t.Errorf("serviceAccountName = %q", svc.Spec.Template.Spec.ServiceAccountName)
	}
	if got := svc.Spec.Template.Annotations["autoscaling.knative.dev/min-scale"]; got != "0" {
		t.Errorf("min-scale = %q, want 0 (scale to zero)", got)
	}
	if got := svc.Labels["networking.knative.dev/visibility"]; got != "cluster-local" {
		t.Errorf("visibility = %q, want cluster-local", got)
	}
}

// TestSharedNetworkPolicyIsWhatTheFunctionBuilds: config/ ships the same
// isolation policy that the function would create on a local cluster with
// default settings, so the two cannot drift apart.
func TestSharedNetworkPolicyIsWhatTheFunctionBuilds(t *testing.T) {
	var shipped networkingv1.NetworkPolicy
	decode(t, "701-networkpolicy-sandboxes.yaml", &shipped)
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sandbox.BuildNetworkPolicy(cfg), &shipped); diff != "" {
		t.Errorf("config/701-networkpolicy-sandboxes.yaml differs from sandbox.BuildNetworkPolicy's defaults (-built +shipped):\n%s", diff)
	}
}

// TestFuncYAMLCarriesNoTrustOrCredential: func's host builder copies
// run.envs into the image, so nothing there may set trust or a credential.
func TestFuncYAMLCarriesNoTrustOrCredential(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "func.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var fy struct {
		Run struct {
			Envs []struct{ Name, Value string }
		}
	}
	if err := yaml.Unmarshal(raw, &fy); err != nil {
		t.Fatal(err)
	}
	for _, e := range fy.Run.Envs {
		if strings.Contains(e.Value, "{{") || strings.HasPrefix(e.Name, "AUTH_") || strings.Contains(e.Name, "KEY") ||
			strings.Contains(e.Name, "TRUST") || e.Name == "PROVISIONER_AUTH_DISABLED" {
			t.Errorf("func.yaml run.envs sets %s: trust settings and credentials belong in deploy-time settings", e.Name)
		}
	}
}

// TestKustomizationListsEveryManifest: `kubectl apply -k config/` (and so
// `make deploy`) applies every manifest in config/, and the image it
// replaces is the one 400-service.yaml names.
func TestKustomizationListsEveryManifest(t *testing.T) {
	var k struct {
		Resources []string `json:"resources"`
		Images    []struct {
			Name string `json:"name"`
		} `json:"images"`
	}
	decode(t, "kustomization.yaml", &k)
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	if diff := cmp.Diff(want, k.Resources); diff != "" {
		t.Errorf("config/kustomization.yaml resources (-files +listed):\n%s", diff)
	}
	var svc servingv1.Service
	decode(t, "400-service.yaml", &svc)
	image := svc.Spec.Template.Spec.Containers[0].Image
	if len(k.Images) != 1 || k.Images[0].Name != image {
		t.Errorf("kustomization images %+v: want exactly the one 400-service.yaml names, %q", k.Images, image)
	}
}

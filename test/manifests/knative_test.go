// Package manifests checks config/ with Knative's own Go types, so a manifest
// Knative would refuse (or warn about) fails here, not at deploy time.
package manifests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	eventingv1 "knative.dev/eventing/pkg/apis/eventing/v1"
	eventingv1alpha1 "knative.dev/eventing/pkg/apis/eventing/v1alpha1"
	"knative.dev/eventing/pkg/apis/feature"
	sourcesv1 "knative.dev/eventing/pkg/apis/sources/v1"
	"knative.dev/pkg/apis"
	"knative.dev/pkg/kmeta"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
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
	knativeAcceptsIn(t, context.Background(), name, obj)
}

// knativeAcceptsIn is knativeAccepts with Knative's settings in ctx (such as
// feature flags).
func knativeAcceptsIn(t *testing.T, ctx context.Context, name string, obj validated) {
	t.Helper()
	ctx = apis.WithinCreate(ctx)
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
	if len(triggers) != 8 {
		t.Fatalf("%d Triggers in config/, want 8 (create, get, list, destroy, pause, resume, egress, reap)", len(triggers))
	}
	for _, file := range triggers {
		var tr eventingv1.Trigger
		name := filepath.Base(file)
		decode(t, name, &tr)
		knativeAccepts(t, name, &tr)
		if a := tr.Spec.Subscriber.Audience; a == nil || *a != audience {
			t.Errorf("%s: subscriber.audience = %v, want %q", name, a, audience)
		}
		subject := triggerSubject(&tr)
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

// TestTriggersAreOneOwner: behind the Broker each event arrives with its
// Trigger's identity, one per operation, so 400-service.yaml groups exactly
// the Triggers' identities as one principal: what the create Trigger made
// the destroy Trigger can find. The group is "default", the backend key's
// principal: one tenant, as the shipped shared claims need. Every member is
// an allowed subject (a group grants no entry), and the PingSource's
// identity stays out (reap judges every sandbox whoever owns it; grouping
// it would only widen its reach).
func TestTriggersAreOneOwner(t *testing.T) {
	var svc servingv1.Service
	decode(t, "400-service.yaml", &svc)
	env := map[string]string{}
	for _, e := range svc.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	groups, err := config.ParsePrincipalGroups(env["PROVISIONER_PRINCIPAL_GROUPS"])
	if err != nil {
		t.Fatalf("400-service.yaml: PROVISIONER_PRINCIPAL_GROUPS: %v", err)
	}
	allowed := strings.Split(env["AUTH_ALLOWED_SUBJECTS"], ",")
	for member, group := range groups {
		if !slices.Contains(allowed, member) {
			t.Errorf("PROVISIONER_PRINCIPAL_GROUPS puts %s in group %q, but it is not in AUTH_ALLOWED_SUBJECTS", member, group)
		}
	}
	want := map[string]string{}
	for _, o := range configObjects(t) {
		switch o.groupKind() {
		case schema.GroupKind{Group: "eventing.knative.dev", Kind: "Trigger"}:
			var tr eventingv1.Trigger
			o.into(t, &tr)
			want[triggerSubject(&tr)] = "default"
		case schema.GroupKind{Group: "sources.knative.dev", Kind: "PingSource"}:
			var ping sourcesv1.PingSource
			o.into(t, &ping)
			subject := "system:serviceaccount:" + ping.Namespace + ":" + ping.Name + "-oidc-sources.knative.dev-pingsource"
			if g, ok := groups[subject]; ok {
				t.Errorf("%s: the PingSource's identity %s is in group %q; reap needs no owner's sandboxes", o.file, subject, g)
			}
		}
	}
	if len(want) != 8 {
		t.Errorf("%d Triggers in config/, want 8 (create, get, list, destroy, pause, resume, egress, reap)", len(want))
	}
	if diff := cmp.Diff(want, groups); diff != "" {
		t.Errorf("400-service.yaml: PROVISIONER_PRINCIPAL_GROUPS, member → group (-the Triggers as default +shipped):\n%s", diff)
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
// isolation policies (the shared one and each egress mode's) that the
// function checks for, and would create on a local cluster, with default
// settings, so the two cannot drift apart.
func TestSharedNetworkPolicyIsWhatTheFunctionBuilds(t *testing.T) {
	var shipped []*networkingv1.NetworkPolicy
	for _, o := range configObjects(t) {
		if o.file == "701-networkpolicy-sandboxes.yaml" {
			np := &networkingv1.NetworkPolicy{}
			o.into(t, np)
			shipped = append(shipped, np)
		}
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(resources.SharedPolicies(cfg.Objects()), shipped); diff != "" {
		t.Errorf("config/701-networkpolicy-sandboxes.yaml differs from resources.SharedPolicies's defaults (-built +shipped):\n%s", diff)
	}
	var router []*networkingv1.NetworkPolicy
	for _, o := range configObjects(t) {
		if o.file == "702-networkpolicy-router.yaml" {
			np := &networkingv1.NetworkPolicy{}
			o.into(t, np)
			router = append(router, np)
		}
	}
	if diff := cmp.Diff([]*networkingv1.NetworkPolicy{resources.BuildRouterPolicy(cfg.Objects())}, router); diff != "" {
		t.Errorf("config/702-networkpolicy-router.yaml differs from resources.BuildRouterPolicy's defaults (-built +shipped):\n%s", diff)
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

// configObject is one object of a config/ file, as YAML reads it.
type configObject struct {
	file string
	obj  map[string]any
}

func (o configObject) groupKind() schema.GroupKind {
	apiVersion, _ := o.obj["apiVersion"].(string)
	kind, _ := o.obj["kind"].(string)
	gv, _ := schema.ParseGroupVersion(apiVersion)
	return schema.GroupKind{Group: gv.Group, Kind: kind}
}

// into decodes the object into a typed one.
func (o configObject) into(t *testing.T, typed any) {
	t.Helper()
	raw, err := json.Marshal(o.obj)
	if err == nil {
		err = json.Unmarshal(raw, typed)
	}
	if err != nil {
		t.Fatalf("%s: %v", o.file, err)
	}
}

// configObjects reads every object in config/*.yaml but kustomization.yaml,
// several to a file where a file has several.
func configObjects(t *testing.T) []configObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in config/: %v", err)
	}
	var out []configObject
	for _, f := range files {
		name := filepath.Base(f)
		if name == "kustomization.yaml" {
			continue
		}
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var obj map[string]any
			err := dec.Decode(&obj)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if obj != nil {
				out = append(out, configObject{file: name, obj: obj})
			}
		}
	}
	return out
}

// triggerSubject is the OIDC identity Knative Eventing gives a Trigger: the
// ServiceAccount <trigger>-oidc-<group>-<kind> (kmeta.ChildName, so hashed
// past 63 characters) in the Trigger's namespace (knative.dev/eventing
// pkg/auth/serviceaccount.go, GetOIDCServiceAccountNameForResource).
func triggerSubject(tr *eventingv1.Trigger) string {
	sa := strings.ToLower(kmeta.ChildName(tr.Name, "-oidc-eventing.knative.dev-trigger"))
	return "system:serviceaccount:" + tr.Namespace + ":" + sa
}

// TestOnlyNamedSendersReachTheBroker: config/ ships the Broker every Trigger
// reads from, and one EventPolicy on exactly that Broker that admits named
// service accounts only: at least one sender of requests, and each Trigger's
// identity, with which the broker filter forwards the function's reply
// events to the broker ingress (eventing v0.50.0
// pkg/broker/filter/filter_handler.go, handleDispatchToReplyRequest).
func TestOnlyNamedSendersReachTheBroker(t *testing.T) {
	brokers := map[string]bool{} // namespace/name
	var triggers []eventingv1.Trigger
	var policies []configObject
	for _, o := range configObjects(t) {
		switch o.groupKind() {
		case schema.GroupKind{Group: "eventing.knative.dev", Kind: "Broker"}:
			var b eventingv1.Broker
			o.into(t, &b)
			// Before defaults: the webhook would fill in the cluster's default class.
			if class := b.Annotations[eventingv1.BrokerClassAnnotationKey]; class != "MTChannelBasedBroker" {
				t.Errorf("%s: %s = %q, want MTChannelBasedBroker (the class hack/install-knative.sh installs)", o.file, eventingv1.BrokerClassAnnotationKey, class)
			}
			knativeAccepts(t, o.file, &b)
			brokers[b.Namespace+"/"+b.Name] = true
		case schema.GroupKind{Group: "eventing.knative.dev", Kind: "Trigger"}:
			var tr eventingv1.Trigger
			o.into(t, &tr)
			triggers = append(triggers, tr)
		case schema.GroupKind{Group: "eventing.knative.dev", Kind: "EventPolicy"}:
			policies = append(policies, o)
		}
	}
	if !brokers["deer-flow/default"] {
		t.Errorf("config/ ships no Broker deer-flow/default (it ships %v)", brokers)
	}
	if len(triggers) == 0 {
		t.Fatal("config/ ships no Trigger")
	}
	for _, tr := range triggers {
		ns, name := tr.Namespace, tr.Spec.Broker
		if ref := tr.Spec.BrokerRef; ref != nil {
			name = ref.Name
			if ref.Namespace != "" {
				ns = ref.Namespace
			}
		}
		if !brokers[ns+"/"+name] {
			t.Errorf("Trigger %s reads from Broker %s/%s, which config/ does not ship", tr.Name, ns, name)
		}
	}

	if len(policies) != 1 {
		t.Fatalf("config/ ships %d EventPolicies, want 1 (on the Broker)", len(policies))
	}
	var ep eventingv1alpha1.EventPolicy
	policies[0].into(t, &ep)
	// Eventing's webhook refuses an EventPolicy while authentication-oidc is off.
	oidc := feature.ToContext(context.Background(), feature.Flags{feature.OIDCAuthentication: feature.Enabled})
	knativeAcceptsIn(t, oidc, policies[0].file, &ep)
	wantTo := []eventingv1alpha1.EventPolicySpecTo{{Ref: &eventingv1alpha1.EventPolicyToReference{
		APIVersion: "eventing.knative.dev/v1", Kind: "Broker", Name: "default"}}}
	if ep.Namespace != "deer-flow" {
		t.Errorf("%s: namespace %q, want deer-flow (the Broker's)", policies[0].file, ep.Namespace)
	}
	// Without `to` a policy covers every resource in its namespace.
	if diff := cmp.Diff(wantTo, ep.Spec.To); diff != "" {
		t.Errorf("%s: spec.to (-want +got):\n%s", policies[0].file, diff)
	}
	subs := map[string]bool{}
	for i, f := range ep.Spec.From {
		switch {
		case f.Ref != nil:
			// A ref that does not resolve leaves the policy not Ready, and
			// the Broker then falls back to the default mode.
			t.Errorf("%s: spec.from[%d] is a ref; name subjects with sub", policies[0].file, i)
		case f.Sub == nil:
		case strings.Contains(*f.Sub, "*"):
			t.Errorf("%s: spec.from[%d].sub %q is a pattern; name each service account", policies[0].file, i, *f.Sub)
		case subs[*f.Sub]:
			t.Errorf("%s: spec.from[%d].sub %q is listed twice", policies[0].file, i, *f.Sub)
		case len(strings.Split(*f.Sub, ":")) != 4 || !strings.HasPrefix(*f.Sub, "system:serviceaccount:"):
			t.Errorf("%s: spec.from[%d].sub %q is not system:serviceaccount:<ns>:<name>", policies[0].file, i, *f.Sub)
		default:
			subs[*f.Sub] = true
		}
	}
	senders := len(subs)
	for _, tr := range triggers {
		s := triggerSubject(&tr)
		if !subs[s] {
			t.Errorf("%s does not admit Trigger %s's identity %s: the function's replies to its events would be refused", policies[0].file, tr.Name, s)
		}
		if subs[s] {
			senders--
		}
	}
	if senders < 1 {
		t.Errorf("%s admits only the Triggers: nobody may send requests", policies[0].file)
	}
}

// TestEventingObjectsFitTheCRDSchemas: every Eventing object in config/
// (the Broker, the EventPolicy, the Triggers, the PingSource) is in a served
// version of its CRD and uses only the fields that version declares, with
// their types. The API server would drop an undeclared field without a word
// (a misspelt `sub` would quietly leave a sender out). Checked against the
// CRDs of the Eventing this module builds with (go.mod) and of the one the
// local cluster runs (hack/tools/knative-eventing), from the module cache.
func TestEventingObjectsFitTheCRDSchemas(t *testing.T) {
	root := filepath.Join("..", "..")
	dirs := map[string]string{"go.mod": eventingModuleDir(t, root)}
	tools := filepath.Join(root, "hack", "tools", "knative-eventing")
	if _, err := os.Stat(filepath.Join(tools, "go.mod")); err == nil {
		dirs["hack/tools/knative-eventing"] = eventingModuleDir(t, tools)
	} else {
		t.Logf("no %s: checking against go.mod's Eventing only", tools)
	}
	eventingGroups := []string{"eventing.knative.dev", "sources.knative.dev", "messaging.knative.dev", "flows.knative.dev"}
	seen := map[string]bool{}
	for _, o := range configObjects(t) {
		gk := o.groupKind()
		if !slices.Contains(eventingGroups, gk.Group) {
			continue
		}
		seen[gk.Kind] = true
		apiVersion, _ := o.obj["apiVersion"].(string)
		gv, _ := schema.ParseGroupVersion(apiVersion)
		body := map[string]any{}
		for k, v := range o.obj {
			if k != "apiVersion" && k != "kind" && k != "metadata" {
				body[k] = v
			}
		}
		for from, dir := range dirs {
			crd := filepath.Join(dir, "config", "core", "resources", strings.ToLower(gk.Kind)+".yaml")
			s, err := crdSchema(crd, gv.Version)
			if err != nil {
				t.Errorf("%s: %s in %s (required by %s): %v", o.file, gk.Kind, filepath.Base(dir), from, err)
				continue
			}
			for _, p := range undeclared("", body, s) {
				t.Errorf("%s: %s (%s's CRD, required by %s)", o.file, p, filepath.Base(dir), from)
			}
		}
	}
	for _, k := range []string{"Broker", "EventPolicy", "Trigger", "PingSource"} {
		if !seen[k] {
			t.Errorf("config/ has no %s to check", k)
		}
	}
}

// eventingModuleDir is knative.dev/eventing's directory in the module cache,
// at the version the module in dir requires (downloaded if missing).
func eventingModuleDir(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", "knative.dev/eventing")
	cmd.Dir = dir
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); err != nil || jerr != nil || info.Dir == "" {
		t.Fatalf("go mod download knative.dev/eventing in %s: %v %s %v", dir, err, info.Error, jerr)
	}
	return info.Dir
}

// crdSchema is the openAPIV3Schema of version in the CRD in file, which must
// serve it.
func crdSchema(file, version string) (map[string]any, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string
				Served bool
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		return nil, err
	}
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			if !v.Served {
				return nil, fmt.Errorf("%s is not served", version)
			}
			return v.Schema.OpenAPIV3Schema, nil
		}
	}
	return nil, fmt.Errorf("no version %s", version)
}

// undeclared lists the fields of v, below path at, that the structural
// schema s does not declare or declares with another type.
func undeclared(at string, v any, s map[string]any) []string {
	if s == nil {
		return nil
	}
	mismatch := func(want string) []string {
		return []string{fmt.Sprintf("%s: %T, the CRD says %s", at, v, want)}
	}
	if s["x-kubernetes-int-or-string"] == true {
		switch v.(type) {
		case string, float64:
			return nil
		}
		return mismatch("int or string")
	}
	switch s["type"] {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return mismatch("object")
		}
		props, _ := s["properties"].(map[string]any)
		extra, _ := s["additionalProperties"].(map[string]any)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var out []string
		for _, k := range keys {
			if ps, ok := props[k].(map[string]any); ok {
				out = append(out, undeclared(at+"."+k, m[k], ps)...)
			} else if extra != nil {
				out = append(out, undeclared(at+"."+k, m[k], extra)...)
			} else if s["x-kubernetes-preserve-unknown-fields"] != true {
				out = append(out, at+"."+k+": not in the CRD (the API server would drop it)")
			}
		}
		return out
	case "array":
		l, ok := v.([]any)
		if !ok {
			return mismatch("array")
		}
		items, _ := s["items"].(map[string]any)
		var out []string
		for i, e := range l {
			out = append(out, undeclared(fmt.Sprintf("%s[%d]", at, i), e, items)...)
		}
		return out
	case "string":
		if _, ok := v.(string); !ok {
			return mismatch("string")
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return mismatch("boolean")
		}
	case "integer":
		if f, ok := v.(float64); !ok || f != float64(int64(f)) {
			return mismatch("integer")
		}
	case "number":
		if _, ok := v.(float64); !ok {
			return mismatch("number")
		}
	}
	return nil
}

// placeholderRegistry is the registry of config/'s image names until `make
// deploy` pins each to a digest: ".invalid" never resolves (RFC 6761), so
// `kubectl apply -k config/` as shipped fails closed (ErrImagePull) rather
// than pulling whatever someone pushed under a name nobody here owns.
const placeholderRegistry = "deploy.invalid/"

// TestImagesFailClosed: every image config/ names for the components built
// here (the function, the egress proxy, the router) is a placeholder under
// placeholderRegistry, without a tag, or is pinned by digest. The sandbox
// templates under config/templates are the operator's choice of sandbox
// image (DeerFlow's own by default) and are not walked.
func TestImagesFailClosed(t *testing.T) {
	var images func(at string, v any) []string
	images = func(at string, v any) []string {
		var out []string
		switch v := v.(type) {
		case map[string]any:
			for k, sub := range v {
				if s, ok := sub.(string); ok && k == "image" {
					out = append(out, at+": "+s)
				} else {
					out = append(out, images(at+"."+k, sub)...)
				}
			}
		case []any:
			for _, sub := range v {
				out = append(out, images(at, sub)...)
			}
		}
		return out
	}
	var found []string
	for _, o := range configObjects(t) {
		for _, img := range images(o.file, o.obj) {
			found = append(found, img)
			_, ref, _ := strings.Cut(img, ": ")
			placeholder := strings.HasPrefix(ref, placeholderRegistry) && !strings.ContainsAny(strings.TrimPrefix(ref, placeholderRegistry), ":@")
			if !placeholder && !strings.Contains(ref, "@sha256:") {
				t.Errorf("%s: want %s<name> (no tag) or an image pinned by digest", img, placeholderRegistry)
			}
		}
	}
	// The walk itself: the three components' images are found.
	if len(found) < 3 {
		t.Errorf("images found in config/: %q, want the function's, the proxy's and the router's", found)
	}
}

// TestRouterAndProxyAreBounded: the two components that carry every
// tenant's traffic, the E2B router and the egress proxy, request and limit
// CPU, memory and ephemeral storage, so no flood through them takes the
// node from the sandboxes (their per-principal bounds are their own code's:
// MaxPerPrincipal).
func TestRouterAndProxyAreBounded(t *testing.T) {
	want := map[string]bool{"sandbox-router": false, "sandbox-egress-proxy": false}
	for _, o := range configObjects(t) {
		if o.obj["kind"] != "Deployment" {
			continue
		}
		raw, err := json.Marshal(o.obj)
		if err != nil {
			t.Fatal(err)
		}
		var d appsv1.Deployment
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		if _, ok := want[d.Name]; !ok {
			continue
		}
		want[d.Name] = true
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
				req, lim := c.Resources.Requests[r], c.Resources.Limits[r]
				if req.IsZero() || lim.IsZero() || lim.Cmp(req) < 0 {
					t.Errorf("%s: container %s: %s request %s, limit %s; want both, the limit no less", o.file, c.Name, r, req.String(), lim.String())
				}
			}
		}
	}
	for name, seen := range want {
		if !seen {
			t.Errorf("no Deployment %s in config/", name)
		}
	}
}

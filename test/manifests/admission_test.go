package manifests

import (
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// admissionObjects is config/800-admission-policy.yaml, typed.
type admissionObjects struct {
	params   corev1.ConfigMap
	policies map[string]admissionv1.ValidatingAdmissionPolicy
	bindings map[string]admissionv1.ValidatingAdmissionPolicyBinding
}

func readAdmission(t *testing.T) admissionObjects {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "800-admission-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := admissionObjects{policies: map[string]admissionv1.ValidatingAdmissionPolicy{}, bindings: map[string]admissionv1.ValidatingAdmissionPolicyBinding{}}
	docs := yaml.NewDocumentDecoder(io.NopCloser(strings.NewReader(string(raw))))
	buf := make([]byte, len(raw))
	for {
		n, err := docs.Read(buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		doc := buf[:n]
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			t.Fatal(err)
		}
		switch kind.Kind {
		case "ConfigMap":
			err = yaml.Unmarshal(doc, &out.params)
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			err = yaml.Unmarshal(doc, &p)
			out.policies[p.Name] = p
		case "ValidatingAdmissionPolicyBinding":
			var b admissionv1.ValidatingAdmissionPolicyBinding
			err = yaml.Unmarshal(doc, &b)
			out.bindings[b.Name] = b
		default:
			t.Fatalf("unexpected %s in config/800-admission-policy.yaml", kind.Kind)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := slices.Sorted(maps.Keys(out.policies)); !slices.Equal(got, []string{"sandbox-provisioner-deletes", "sandbox-provisioner-pods", "sandbox-provisioner-replicasets", "sandbox-provisioner-secrets", "sandbox-provisioner-services"}) {
		t.Fatalf("policies %v", got)
	}
	return out
}

// TestPodAndReplicaSetRulesAreTheSame: the ReplicaSet policy checks its Pod
// template with exactly the Pod policy's rules (the same CEL text, the
// object path set once in the first variables), plus its own two first;
// the Pod policy adds its own one last (what an update may change). A rule
// added to one and not the other fails here.
func TestPodAndReplicaSetRulesAreTheSame(t *testing.T) {
	a := readAdmission(t)
	pod, rs := a.policies["sandbox-provisioner-pods"].Spec, a.policies["sandbox-provisioner-replicasets"].Spec

	// Where the Pod is: the only variables that differ.
	where := map[string][2]string{
		"spec":          {"object.spec", "object.spec.template.spec"},
		"metadata":      {"object.metadata", "object.spec.template.metadata"},
		"oldMetadata":   {"oldObject.metadata", "oldObject.spec.template.metadata"},
		"boundNodeName": {"request.operation == 'UPDATE' && has(oldObject.spec.nodeName) ? oldObject.spec.nodeName : ''", "''"},
		"pool": {"''", "has(object.spec.selector.matchLabels) && !('sandbox-id' in object.spec.selector.matchLabels) &&" +
			" 'sandbox.deerflow.dev/pool' in object.spec.selector.matchLabels ? object.spec.selector.matchLabels['sandbox.deerflow.dev/pool'] : ''"},
	}
	const kindVars = 5
	if len(pod.Variables) < kindVars || len(rs.Variables) < kindVars {
		t.Fatalf("variables: Pod %d, ReplicaSet %d", len(pod.Variables), len(rs.Variables))
	}
	for i := 0; i < kindVars; i++ {
		p, r := pod.Variables[i], rs.Variables[i]
		w, ok := where[p.Name]
		if !ok || r.Name != p.Name || p.Expression != w[0] || r.Expression != w[1] {
			t.Errorf("variable %d: Pod %s=%q, ReplicaSet %s=%q; want one of %v", i, p.Name, p.Expression, r.Name, r.Expression, where)
		}
	}
	if diff := cmp.Diff(pod.Variables[kindVars:], rs.Variables[kindVars:]); diff != "" {
		t.Errorf("shared variables differ (-Pod +ReplicaSet):\n%s", diff)
	}
	const rsOwn = 4  // replicas, selector, name and id, the Service's pins: first
	const podOwn = 5 // what an update may change, name and id, a pool Pod's wiring, the Service's two pins: last
	if len(rs.Validations)-rsOwn != len(pod.Validations)-podOwn || len(pod.Validations) < podOwn {
		t.Fatalf("validations: Pod %d, ReplicaSet %d, want the same but the Pod's own %d and the ReplicaSet's own %d", len(pod.Validations), len(rs.Validations), podOwn, rsOwn)
	}
	shared := pod.Validations[:len(pod.Validations)-podOwn]
	if diff := cmp.Diff(shared, rs.Validations[rsOwn:]); diff != "" {
		t.Errorf("validations differ (-Pod +ReplicaSet):\n%s", diff)
	}
	own := append(slices.Clone(rs.Validations[:rsOwn]), pod.Validations[len(shared):]...)
	for _, v := range own {
		if strings.Contains(strings.ReplaceAll(v.Expression+v.MessageExpression, "variables.pool", ""), "variables.") {
			t.Errorf("own rule %q reads the Pod through variables: it belongs with the shared ones", v.Message)
		}
	}
	// Nothing in the shared rules may name the object directly: only the
	// variables above know where the Pod is.
	for _, v := range shared {
		if regexp.MustCompile(`\b(object|oldObject)\.`).MatchString(v.Expression) {
			t.Errorf("shared rule %q reads the object directly; go through variables", v.Message)
		}
	}
	for _, v := range pod.Variables[kindVars:] {
		if regexp.MustCompile(`\b(object|oldObject)\.`).MatchString(v.Expression) {
			t.Errorf("shared variable %s reads the object directly; go through the first variables", v.Name)
		}
	}
	pc, rc := pod.DeepCopy(), rs.DeepCopy()
	pc.Variables, rc.Variables, pc.Validations, rc.Validations = nil, nil, nil, nil
	pc.MatchConstraints.ResourceRules[0].APIGroups, rc.MatchConstraints.ResourceRules[0].APIGroups = nil, nil
	pc.MatchConstraints.ResourceRules[0].Resources, rc.MatchConstraints.ResourceRules[0].Resources = nil, nil
	if diff := cmp.Diff(pc, rc); diff != "" {
		t.Errorf("the two policies differ beyond the resource they match (-Pod +ReplicaSet):\n%s", diff)
	}
	for name, p := range a.policies {
		ops := p.Spec.MatchConstraints.ResourceRules[0].Operations
		if name == deletePolicy {
			// Its rules read oldObject, which only a DELETE has as the
			// stored object (TestAdmissionCoversEveryDelete).
			for _, r := range p.Spec.MatchConstraints.ResourceRules {
				if !slices.Equal(r.Operations, []admissionv1.OperationType{admissionv1.Delete}) {
					t.Errorf("%s: operations %v, want DELETE alone", name, r.Operations)
				}
			}
			if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
				t.Errorf("%s: failurePolicy %v, want Fail", name, p.Spec.FailurePolicy)
			}
		} else if !slices.Contains(ops, admissionv1.Create) || !slices.Contains(ops, admissionv1.Update) || p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("%s: operations %v, failurePolicy %v; want CREATE and UPDATE, Fail", name, ops, p.Spec.FailurePolicy)
		}
		b, ok := a.bindings[name]
		if !ok || b.Spec.PolicyName != name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) {
			t.Errorf("%s: binding %+v, want one that denies", name, b.Spec)
		}
		if p.Spec.ParamKind != nil {
			pr := b.Spec.ParamRef
			if pr == nil || pr.Name != a.params.Name || pr.Namespace != a.params.Namespace || pr.ParameterNotFoundAction == nil || *pr.ParameterNotFoundAction != admissionv1.DenyAction {
				t.Errorf("%s: paramRef %+v, want %s/%s, denying when it is missing", name, pr, a.params.Namespace, a.params.Name)
			}
		}
	}
}

const deletePolicy = "sandbox-provisioner-deletes"

// TestAdmissionCoversEveryDelete: every resource the Role lets the
// provisioner delete is one whose deletes the delete policy judges, so a
// delete verb added to the Role without a rule fails here.
func TestAdmissionCoversEveryDelete(t *testing.T) {
	var role rbacv1.Role
	decode(t, "201-role.yaml", &role)
	judged := map[string]bool{}
	for _, r := range readAdmission(t).policies[deletePolicy].Spec.MatchConstraints.ResourceRules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				judged[g+"/"+res] = true
			}
		}
	}
	var deletable []string
	for _, r := range role.Rules {
		if !slices.Contains(r.Verbs, "delete") && !slices.Contains(r.Verbs, "deletecollection") && !slices.Contains(r.Verbs, "*") {
			continue
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				deletable = append(deletable, g+"/"+res)
			}
		}
	}
	if len(deletable) == 0 {
		t.Fatal("the Role grants no delete: this test reads it wrong")
	}
	for _, d := range deletable {
		if !judged[d] {
			t.Errorf("the Role lets the provisioner delete %s, which %s does not judge", d, deletePolicy)
		}
	}
}

// TestAdmissionMatchesTheRoleBinding: every policy applies to the
// ServiceAccount config/'s RoleBinding gives the provisioner's Role.
func TestAdmissionMatchesTheRoleBinding(t *testing.T) {
	var rb rbacv1.RoleBinding
	decode(t, "202-rolebinding.yaml", &rb)
	if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" {
		t.Fatalf("RoleBinding subjects %+v, want one ServiceAccount", rb.Subjects)
	}
	user := "system:serviceaccount:" + rb.Subjects[0].Namespace + ":" + rb.Subjects[0].Name
	for name, p := range readAdmission(t).policies {
		want := []admissionv1.MatchCondition{{Name: "created-by-the-provisioner", Expression: "request.userInfo.username == '" + user + "'"}}
		if diff := cmp.Diff(want, p.Spec.MatchConditions); diff != "" {
			t.Errorf("%s matches (-want +got):\n%s", name, diff)
		}
	}
}

// TestAdmissionParamsAdmitTheDefaults: the policies' parameters admit what
// the function builds with its default settings and what templates may add
// by default, and hold every setting the rules read.
func TestAdmissionParamsAdmitTheDefaults(t *testing.T) {
	a := readAdmission(t)
	// The settings as config/ deploys them: the code's defaults under the
	// plain values 400-service.yaml sets (SANDBOX_RUNTIME_CLASS among them).
	var svc servingv1.Service
	decode(t, "400-service.yaml", &svc)
	for _, e := range svc.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			t.Setenv(e.Name, e.Value)
		}
	}
	// The key comes from the Secret at deploy time; the shipped group
	// "default" (the Triggers as the backend's own) needs it set.
	t.Setenv("PROVISIONER_API_KEY", "a-stand-in-for-the-secret-0123")
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	data := a.params.Data
	list := func(key string) []string { return strings.Split(data[key], ",") }

	read := map[string]bool{}
	for _, p := range a.policies {
		var texts []string
		for _, v := range p.Spec.Variables {
			texts = append(texts, v.Expression)
		}
		for _, v := range p.Spec.Validations {
			texts = append(texts, v.Expression, v.MessageExpression)
		}
		for _, m := range regexp.MustCompile(`params\.data\['([A-Za-z]+)'\]`).FindAllStringSubmatch(strings.Join(texts, "\n"), -1) {
			read[m[1]] = true
		}
	}
	if diff := cmp.Diff(slices.Sorted(maps.Keys(read)), slices.Sorted(maps.Keys(data))); diff != "" {
		t.Errorf("settings the rules read vs the ConfigMap holds (-read +held):\n%s", diff)
	}

	if got, want := data["capabilities"], strings.Join(config.AllowedCapabilities, ","); got != want {
		t.Errorf("capabilities %q, want pkg/config's allow-list %q", got, want)
	}
	// The roots sandbox.hostRootOf gives host mounts: the thread's and the
	// user's directories (read-write), the base's children (shared).
	for key, root := range map[string]string{"hostPathRoots": cfg.ThreadsHostPath + "/*", "hostPathSharedRoots": cfg.HostBaseDir + "/*"} {
		if !slices.Contains(list(key), root) {
			t.Errorf("%s %q lacks %q", key, data[key], root)
		}
	}
	if !slices.Contains(list("hostPathRoots"), cfg.HostBaseDir+"/users/*") {
		t.Errorf("hostPathRoots %q lacks the users' directories %q", data["hostPathRoots"], cfg.HostBaseDir+"/users/*")
	}
	// The claims the function mounts in PVC mode, as config/ deploys it.
	for _, claim := range []string{cfg.SkillsPVCName, cfg.UserdataPVCName} {
		if claim == "" || !slices.Contains(list("persistentVolumeClaims"), claim) {
			t.Errorf("persistentVolumeClaims %q lacks the claim %q config/ mounts", data["persistentVolumeClaims"], claim)
		}
	}
	// What the shipped templates mount beyond the Pod, and nothing more.
	want := map[string][]string{}
	for _, v := range shippedTemplateVolumes(t) {
		switch {
		case v.NFS != nil:
			want["nfsVolumes"] = append(want["nfsVolumes"], v.NFS.Server+":"+v.NFS.Path)
		case v.Image != nil:
			want["imageVolumes"] = append(want["imageVolumes"], v.Image.Reference)
		case v.CSI != nil:
			want["csiDrivers"] = append(want["csiDrivers"], v.CSI.Driver)
		case v.PersistentVolumeClaim != nil:
			t.Errorf("a shipped template mounts the claim %s: list it beside config/'s", v.PersistentVolumeClaim.ClaimName)
		}
	}
	got := map[string][]string{}
	for _, key := range []string{"nfsVolumes", "imageVolumes", "csiDrivers", "ephemeralSources"} {
		if data[key] != "" {
			got[key] = list(key)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the allow-lists of storage beyond the Pod (-what the shipped templates mount +the parameters):\n%s", diff)
	}
	tolerations := append(slices.Clone(cfg.Tolerations), cfg.TemplateTolerations...)
	tolerations = append(tolerations, "node.kubernetes.io/not-ready:NoExecute", "node.kubernetes.io/unreachable:NoExecute")
	for _, tl := range tolerations {
		if !slices.Contains(list("tolerations"), tl) {
			t.Errorf("tolerations %q lacks %q", data["tolerations"], tl)
		}
	}
	for _, an := range append([]string{"sandbox.deerflow.dev/*"}, cfg.TemplateAnnotations...) {
		if !slices.Contains(list("annotations"), an) {
			t.Errorf("annotations %q lacks %q", data["annotations"], an)
		}
	}
	for k, v := range cfg.IngressFromPodLabels {
		if !slices.Contains(list("forbiddenLabels"), k+"="+v) {
			t.Errorf("forbiddenLabels %q lacks the backend's label %s=%s", data["forbiddenLabels"], k, v)
		}
	}
	for key, want := range map[string]string{
		"priorityClasses": strings.Join(cfg.TemplatePriorityClasses, ","), "runtimeClassName": cfg.RuntimeClassName,
		"userNamespace": strconv.FormatBool(cfg.UserNamespace), "nonRoot": strconv.FormatBool(cfg.RunAsNonRoot),
		"maxPoolSize": strconv.Itoa(cfg.MaxPoolSize), "serviceAccountName": cfg.ServiceAccountName,
	} {
		if data[key] != want {
			t.Errorf("%s %q, want %q as the defaults", key, data[key], want)
		}
	}
}

// shippedTemplateVolumes are the volumes of config/templates' PodTemplates.
func shippedTemplateVolumes(t *testing.T) []corev1.Volume {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "templates", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("config/templates: %v (%d files)", err, len(files))
	}
	var out []corev1.Volume
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pt corev1.PodTemplate
		if err := yaml.Unmarshal(raw, &pt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, pt.Template.Spec.Volumes...)
	}
	return out
}

// TestHostPathRootsDoNotNest: no root a sandbox may mount read-write holds
// another root. If one did, a sandbox given the outer one read-write could
// replace the inner one with a link to the node's /, which the kubelet
// would follow when another sandbox mounts the inner root. (The shared
// roots hold the tenants' roots, and are mounted read-only only.)
func TestHostPathRootsDoNotNest(t *testing.T) {
	data := readAdmission(t).params.Data
	rw := strings.Split(data["hostPathRoots"], ",")
	roots := append(slices.Clone(rw), strings.Split(data["hostPathSharedRoots"], ",")...)
	for _, r := range roots {
		if !strings.HasPrefix(r, "/") || r == "/" || strings.Contains(r, "..") || strings.HasSuffix(r, "/") {
			t.Errorf("hostPathRoots entry %q is not an absolute, clean directory other than /", r)
		}
	}
	for _, tc := range []struct {
		a, b string
		want bool
	}{{"/x", "/x/users/*", true}, {"/x/users/*", "/x/users/a/b", true}, {"/x/users/*", "/x/skills", false}, {"/x/a", "/x/ab", false}} {
		if got := nests(tc.a, tc.b); got != tc.want {
			t.Errorf("nests(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	for _, a := range rw {
		for _, b := range roots {
			if nests(a, b) {
				t.Errorf("hostPath root %q lies inside the read-write root %q", b, a)
			}
		}
	}
}

// nests reports whether some path outer matches is a proper ancestor of
// some path inner matches ('*' is any one segment).
func nests(outer, inner string) bool {
	o, i := strings.Split(outer, "/"), strings.Split(inner, "/")
	if len(o) >= len(i) {
		return false
	}
	for k := range o {
		if o[k] != i[k] && o[k] != "*" && i[k] != "*" {
			return false
		}
	}
	return true
}

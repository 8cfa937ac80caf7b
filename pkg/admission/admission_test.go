package admission

import (
	"errors"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The refusals below are the API server's own wording (k8s.io/apiserver's
// admission plugins and RBAC), as a create of a sandbox Pod meets them.
func TestAdmissionRefusalNamesWhatRefused(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	forbidden := func(msg string) error { return apierrors.NewForbidden(pods, "sandbox-x", errors.New(msg)) }
	invalid := func(msg string) error {
		return apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "sandbox-x", field.ErrorList{field.Invalid(field.NewPath(""), nil, msg)})
	}
	type want struct {
		Kind     api.Kind
		Contains []string
	}
	tests := []struct {
		name string
		env  map[string]string
		err  error
		spec func(*api.Spec)
		want *want // nil: not an admission refusal, classify's wording applies
	}{{
		name: "Pod Security refuses host-path mode",
		err:  forbidden(`violates PodSecurity "baseline:latest": hostPath volumes (volumes "host-user", "host-thread")`),
		want: &want{api.KindInternal, []string{`Pod Security "baseline:latest"`, "hostPath volumes", "USERDATA_PVC_NAME", "pod-security.kubernetes.io/enforce"}},
	}, {
		name: "Pod Security in PVC mode points at the namespace and the sandbox settings",
		env:  map[string]string{"USERDATA_PVC_NAME": "home", "SKILLS_PVC_NAME": "skills"},
		err:  forbidden(`violates PodSecurity "baseline:latest": non-default capabilities (container "sandbox" must not include "SYS_ADMIN")`),
		want: &want{api.KindInternal, []string{`Pod Security "baseline:latest"`, "SYS_ADMIN", "SANDBOX_CAPABILITIES_ADD"}},
	}, {
		name: "our admission policy, as Forbidden",
		err:  forbidden(`ValidatingAdmissionPolicy 'sandbox-provisioner-pods' with binding 'sandbox-provisioner-pods' denied request: a sandbox may mount only the DeerFlow base directory /.deer-flow from the node`),
		want: &want{api.KindInternal, []string{"admission policy sandbox-provisioner-pods", "base directory /.deer-flow", "DEER_FLOW_HOST_BASE_DIR"}},
	}, {
		name: "our admission policy, as Invalid (a policy's default reason)",
		err:  invalid(`ValidatingAdmissionPolicy 'sandbox-provisioner-pods' with binding 'sandbox-provisioner-pods' denied request: sandbox containers must drop ALL capabilities`),
		want: &want{api.KindInternal, []string{"admission policy sandbox-provisioner-pods", "drop ALL"}},
	}, {
		name: "an admission policy refusing what a template adds names the template",
		spec: func(s *api.Spec) { s.Template = "python" },
		err:  forbidden(`ValidatingAdmissionPolicy 'sandbox-provisioner-pods' with binding 'b' denied request: no Secret volumes`),
		want: &want{api.KindInternal, []string{"admission policy sandbox-provisioner-pods", "template python"}},
	}, {
		name: "an annotation refused names where such annotations come from",
		err:  forbidden(`ValidatingAdmissionPolicy 'sandbox-provisioner-pods' with binding 'b' denied request: a sandbox may carry only the annotations sandbox.deerflow.dev/*`),
		want: &want{api.KindInternal, []string{"admission policy sandbox-provisioner-pods", "mutating webhook", "kubernetes.io/limit-ranger"}},
	}, {
		name: "a webhook",
		err:  forbidden(`admission webhook "policy.example.com" denied the request: image not signed`),
		want: &want{api.KindInternal, []string{"admission webhook policy.example.com", "image not signed"}},
	}, {
		name: "a LimitRange refusing the cpu the request asked for is the caller's",
		spec: func(s *api.Spec) { s.Requested.CPU = true },
		err:  forbidden(`maximum cpu usage per Container is 2, but limit is 4`),
		want: &want{api.KindInvalid, []string{"LimitRange", "limit is 4", "ask for less"}},
	}, {
		name: "a LimitRange refusing the defaults is the operator's",
		err:  forbidden(`maximum memory usage per Container is 512Mi, but limit is 1Gi`),
		want: &want{api.KindInternal, []string{"LimitRange", "SANDBOX_MEMORY_LIMIT"}},
	}, {
		name: "a ResourceQuota",
		err:  forbidden(`exceeded quota: sandboxes, requested: pods=1, used: pods=5, limited: pods=5`),
		want: &want{api.KindQuota, []string{"ResourceQuota sandboxes"}},
	}, {
		name: "RBAC is left to classify, which names the Role",
		err:  apierrors.NewForbidden(pods, "", errors.New(`User "system:serviceaccount:deer-flow:sandbox-provisioner" cannot create resource "pods" in API group "" in the namespace "deer-flow"`)),
	}, {
		name: "a plain validation error is left to classify",
		err:  invalid(`spec.containers[0].image: Required value`),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SANDBOX_IMAGE": "sandbox:1"}
			for k, v := range tc.env {
				env[k] = v
			}
			cfg := testConfig(t, env)
			s := testSpec()
			if tc.spec != nil {
				tc.spec(&s)
			}
			got := Refusal(cfg.Namespace, &cfg.DeerFlowConfig, tc.err, s, "Pod")
			if tc.want == nil {
				if got != nil {
					t.Fatalf("Refusal = %v, want nil", got)
				}
				if d := api.DetailOf(api.Classify(tc.err, "create the sandbox Pod")); strings.Contains(tc.err.Error(), "cannot create") && !strings.Contains(d, "check its Role") {
					t.Errorf("classify detail %q, want RBAC's", d)
				}
				return
			}
			if got == nil {
				t.Fatal("Refusal = nil, want a refusal")
			}
			detail := api.DetailOf(got)
			var missing []string
			for _, w := range tc.want.Contains {
				if !strings.Contains(detail, w) {
					missing = append(missing, w)
				}
			}
			if diff := cmp.Diff(want{tc.want.Kind, nil}, want{api.KindOf(got), missing}); diff != "" {
				t.Errorf("refusal %q (-want +got):\n%s", detail, diff)
			}
			if strings.Contains(detail, "Role") {
				t.Errorf("detail %q sends the operator to the Role", detail)
			}
		})
	}
}

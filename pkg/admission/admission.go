// Package admission explains the API server's refusals by admission
// (Pod Security, admission policies, webhooks, LimitRanges, quotas) to the
// caller: what refused, what it refused, and whose it is to fix.
package admission

import (
	"fmt"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// The API server's refusals by admission, as its messages name them
// (k8s.io/apiserver's admission plugins: PodSecurity, the
// ValidatingAdmissionPolicy plugin, webhooks, LimitRanger, ResourceQuota).
// RBAC's own refusal reads `User "…" cannot create resource "pods"`.
var (
	podSecurityRefusal = regexp.MustCompile(`violates PodSecurity "([^"]+)": (.*)$`)
	policyRefusal      = regexp.MustCompile(`ValidatingAdmissionPolicy '([^']+)' with binding '[^']*' denied request: (.*)$`)
	webhookRefusal     = regexp.MustCompile(`admission webhook "([^"]+)" denied the request: (.*)$`)
	limitRangeRefusal  = regexp.MustCompile(`(?:maximum|minimum) [a-z-]+ usage per (?:Container|Pod) is [^,]+, but (?:limit|request) is \S+`)
	quotaRefusal       = regexp.MustCompile(`exceeded quota: ([^,]+), (.*)$`)
	rbacRefusal        = regexp.MustCompile(`cannot [a-z]+ resource "`)
)

// Refusal explains a create the API server refused at admission,
// naming what refused it and what it refused, so that nobody is sent to a
// Role that was never the problem. A refusal caused by what the request
// asked for (resources beyond a LimitRange) is the caller's to fix (422);
// one the built objects draw whatever the request says (Pod Security in
// host-path mode, an admission policy out of step with the settings, a
// template) is the operator's (500, naming the setting). It returns nil for
// anything that is not an admission refusal.
// The settings it names come from namespace (the sandboxes') and df (the
// host-path or PVC mode).
func Refusal(namespace string, df *config.DeerFlowConfig, err error, s api.Spec, kind string) error {
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		return nil
	}
	msg := err.Error()
	if st, ok := err.(apierrors.APIStatus); ok {
		msg = st.Status().Message
	}
	operator := func(format string, args ...any) error {
		detail := "the sandbox " + kind + " was refused by " + fmt.Sprintf(format, args...)
		if s.Template != "" {
			detail += "; template " + s.Template + " may be what adds it"
		}
		return api.Errorf(api.KindInternal, err, "%s", detail)
	}
	switch {
	case podSecurityRefusal.MatchString(msg):
		m := podSecurityRefusal.FindStringSubmatch(msg)
		fix := "run sandboxes in PVC mode (USERDATA_PVC_NAME and SKILLS_PVC_NAME) or relax the namespace's pod-security.kubernetes.io/enforce label"
		if df.UserdataPVCName != "" && df.SkillsPVCName != "" {
			fix = "check the namespace's pod-security.kubernetes.io/enforce label and the sandbox settings (SANDBOX_CAPABILITIES_ADD, SANDBOX_RUN_AS_USER)"
		}
		return operator("Pod Security %q in namespace %s: %s; %s", m[1], namespace, m[2], fix)
	case policyRefusal.MatchString(msg):
		m := policyRefusal.FindStringSubmatch(msg)
		// The provisioner sets only allowed annotations; others come from
		// admission in between (a LimitRange filling in resources, a
		// mutating webhook), which the caller never sees.
		annotated := ""
		if strings.Contains(m[2], "annotations") {
			annotated = "; annotations the provisioner does not set come from a mutating webhook or a LimitRange that fills in a container's resources (kubernetes.io/limit-ranger)"
		}
		return operator("the admission policy %s: %s; the function's settings (DEER_FLOW_HOST_BASE_DIR, THREADS_HOST_PATH, SANDBOX_CAPABILITIES_ADD, SANDBOX_RUN_AS_USER) "+
			"and the policy's parameters (ConfigMap sandbox-admission in namespace %s) must agree%s", m[1], m[2], namespace, annotated)
	case webhookRefusal.MatchString(msg):
		m := webhookRefusal.FindStringSubmatch(msg)
		return operator("the admission webhook %s: %s", m[1], m[2])
	case limitRangeRefusal.MatchString(msg):
		what := limitRangeRefusal.FindString(msg)
		if s.Requested.CPU || s.Requested.Memory {
			return api.Errorf(api.KindInvalid, err, "the namespace's LimitRange refuses the resources asked for (%s); ask for less cpu or memory", what)
		}
		return operator("the namespace's LimitRange: %s; set SANDBOX_CPU_LIMIT, SANDBOX_MEMORY_LIMIT and SANDBOX_EPHEMERAL_STORAGE within it", what)
	case quotaRefusal.MatchString(msg):
		m := quotaRefusal.FindStringSubmatch(msg)
		return api.Errorf(api.KindQuota, err, "the namespace's ResourceQuota %s is exhausted (%s); destroy sandboxes or raise it", m[1], m[2])
	case apierrors.IsForbidden(err) && !rbacRefusal.MatchString(msg) && !strings.Contains(msg, "error looking up service account"):
		return operator("the API server: %s", msg)
	}
	return nil
}

package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLoadDefaultsMatchDeerFlow(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{
		"K8S_NAMESPACE": c.Namespace, "SKILLS_HOST_PATH": c.SkillsHostPath, "THREADS_HOST_PATH": c.ThreadsHostPath,
		"DEER_FLOW_HOST_BASE_DIR": c.HostBaseDir, "SANDBOX_CONTAINER_PORT": c.ContainerPort, "SANDBOX_SERVICE_TYPE": c.ServiceType,
		"NODE_HOST": c.NodeHost, "SANDBOX_IDLE_TIMEOUT": c.IdleTimeout, "PROVISIONER_AUTH_DISABLED": c.AuthDisabled,
		"AUTH_TOKEN_AUDIENCE": c.TokenAudience, "SANDBOX_RUN_AS_NON_ROOT": c.RunAsNonRoot, "SANDBOX_USER_NAMESPACE": c.UserNamespace,
		"SANDBOX_EGRESS_MODE": c.EgressMode, "waits fit the runtime": c.RequestTimeout+c.MaxReadyWait <= RuntimeWriteBudget,
		"SKILLS_PVC_SUBPATH_TEMPLATE": c.SkillsPVCSubpathTemplate,
	}
	want := map[string]any{
		"K8S_NAMESPACE": "deer-flow", "SKILLS_HOST_PATH": "", "THREADS_HOST_PATH": "/.deer-flow/threads",
		"DEER_FLOW_HOST_BASE_DIR": "/.deer-flow", "SANDBOX_CONTAINER_PORT": int32(8080), "SANDBOX_SERVICE_TYPE": "NodePort",
		"NODE_HOST": "host.docker.internal", "SANDBOX_IDLE_TIMEOUT": time.Hour, "PROVISIONER_AUTH_DISABLED": false,
		"AUTH_TOKEN_AUDIENCE": "", "SANDBOX_RUN_AS_NON_ROOT": true, "SANDBOX_USER_NAMESPACE": true,
		"SANDBOX_EGRESS_MODE": "internet", "waits fit the runtime": true,
		"SKILLS_PVC_SUBPATH_TEMPLATE": "",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

func TestLoadRejectsBadValuesNamingTheVariable(t *testing.T) {
	tests := []struct{ name, value string }{
		{"K8S_NAMESPACE", "Deer_Flow"},
		{"SANDBOX_SERVICE_TYPE", "LoadBalancer"},
		{"SANDBOX_CONTAINER_PORT", "70000"},
		{"SANDBOX_CONTAINER_PORT", "http"},
		{"SKILLS_HOST_PATH", "skills"},
		{"DEER_FLOW_HOST_BASE_DIR", "/a/../b"},
		{"K8S_API_SERVER", "ftp://x"},
		{"SANDBOX_IDLE_TIMEOUT", "soon"},
		{"SANDBOX_IDLE_TIMEOUT", "-1s"},
		{"SANDBOX_CPU_LIMIT", "lots"},
		{"SANDBOX_TOLERATIONS", "key=value"},
		{"SANDBOX_RUNTIME_CLASS", "Not Valid"},
		{"SKILLS_PVC_SUBPATH_TEMPLATE", "/abs/{user_id}"},
		{"SKILLS_PVC_SUBPATH_TEMPLATE", "skills/{name}"}, // the seed's placeholder; DeerFlow formats only user_id and thread_id
		{"SKILLS_PVC_SUBPATH_TEMPLATE", "{user_id}/../x"},
		{"SKILLS_PVC_SUBPATH_TEMPLATE", "a/./{thread_id}"},
		{"THREADS_HOST_PATH", "/.deer-flow/users/alice/threads"},
		{"USERDATA_PVC_NAME", "UPPER"},
		{"NODE_HOST", "http://x"},
		{"LOG_LEVEL", "loud"},
		{"SANDBOX_EGRESS_DENY_CIDRS", "169.254.169.254"},
		{"SANDBOX_EGRESS_DENY_CIDRS", "192.0.2.2/24"}, // host bits: the API server would refuse the policy
		{"SANDBOX_CAPABILITIES_ADD", "sys_admin"},
		{"MAX_SANDBOXES", "-1"},
		{"K8S_EVENTS_QPS", "0"},
		// The capability allow-list: each of these used to pass a deny-list.
		{"SANDBOX_CAPABILITIES_ADD", "NET_ADMIN"},
		{"SANDBOX_CAPABILITIES_ADD", "BPF"},
		{"SANDBOX_CAPABILITIES_ADD", "SYS_RAWIO"},
		{"SANDBOX_CAPABILITIES_ADD", "CHOWN,DAC_READ_SEARCH"},
		{"SKILLS_HOST_PATH", "/skills"},
		{"THREADS_HOST_PATH", "/var/lib"},
		{"SANDBOX_RUN_AS_USER", "0"},
		{"SANDBOX_EGRESS_MODE", "none"},
		{"SANDBOX_INGRESS_FROM_POD_LABELS", "app:deer-flow-sandbox"},
		{"SANDBOX_MAX_READY_WAIT", "60s"},
		{"REQUEST_TIMEOUT", "25s"},
		{"MAX_CONCURRENT_WAITS", "0"},
		{"AUTH_ALLOWED_SUBJECTS", "system:serviceaccount:*:*"},
		{"AUTH_ALLOWED_SUBJECTS", "alice"},
		{"AUTH_ALLOWED_SUBJECTS", "system:serviceaccount:deer-flow:a*"},
		{"PROVISIONER_AUTH_DISABLED", "true"}, // LISTEN_ADDRESS defaults to [::]:8080
	}
	for _, tc := range tests {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Errorf("Load() error = %v, want one naming %s", err, tc.name)
			}
		})
	}
}

// SKILLS_HOST_PATH was the seed's one skills directory; DeerFlow's
// provisioner no longer reads it. An operator who still sets it is told what
// replaced it instead of having it silently ignored.
func TestSkillsHostPathSaysWhatReplacedIt(t *testing.T) {
	t.Setenv("SKILLS_HOST_PATH", "/.deer-flow/skills")
	_, err := Load()
	if err == nil || !strings.Contains(err.Error(), "SKILLS_HOST_PATH: is no longer used") || !strings.Contains(err.Error(), "skills_view") {
		t.Errorf("Load() = %v, want SKILLS_HOST_PATH refused naming the skills_view layout that replaced it", err)
	}
}

func TestSkillsSubPathTemplateAcceptsDeerFlowsPlaceholders(t *testing.T) {
	for _, v := range []string{"", "skills", "deer-flow/users/{user_id}/threads/{thread_id}/skills", "{user_id}"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("SKILLS_PVC_SUBPATH_TEMPLATE", v)
			if _, err := Load(); err != nil {
				t.Errorf("Load() = %v, want %q accepted", err, v)
			}
		})
	}
}

func TestAuthDisabledOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:8080", true}, {"[::1]:8080", true}, {"localhost:8080", true},
		{"[::]:8080", false}, {"0.0.0.0:8080", false}, {"10.0.0.5:8080", false}, {":8080", false},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			t.Setenv("PROVISIONER_AUTH_DISABLED", "true")
			t.Setenv("LISTEN_ADDRESS", tc.addr)
			_, err := Load()
			if (err == nil) != tc.ok {
				t.Errorf("Load() with LISTEN_ADDRESS=%s: %v, want ok=%v", tc.addr, err, tc.ok)
			}
		})
	}
}

func TestParseTolerations(t *testing.T) {
	got, err := ParseTolerations([]string{"dedicated=sandbox:NoSchedule", "gpu:NoExecute"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Value != "sandbox" || got[1].Operator != "Exists" {
		t.Errorf("ParseTolerations = %+v", got)
	}
}

func FuzzConfig(f *testing.F) {
	f.Add("K8S_NAMESPACE", "deer-flow")
	f.Add("SANDBOX_TOLERATIONS", "a=b:NoSchedule,c:NoExecute")
	f.Add("SANDBOX_NODE_SELECTOR", "a:b,c:d")
	f.Add("SANDBOX_EGRESS_DENY_CIDRS", "10.0.0.0/8")
	f.Fuzz(func(t *testing.T, name, value string) {
		known := map[string]bool{"K8S_NAMESPACE": true, "SANDBOX_TOLERATIONS": true, "SANDBOX_NODE_SELECTOR": true,
			"SANDBOX_EGRESS_DENY_CIDRS": true, "SANDBOX_CPU_LIMIT": true, "SANDBOX_IDLE_TIMEOUT": true, "NODE_HOST": true}
		if !known[name] || strings.ContainsRune(value, 0) {
			return
		}
		t.Setenv(name, value)
		if _, err := Load(); err != nil && err.Error() == "" {
			t.Fatal("empty error")
		}
	})
}

package config

import (
	"fmt"
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
		"SANDBOX_EGRESS_MODE": "open", "waits fit the runtime": true,
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
		{"SANDBOX_SERVICE_TYPE", "headless"},
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
		{"PROVISIONER_API_KEYS", "alice"},
		{"PROVISIONER_API_KEYS", "alice=short"},
		{"PROVISIONER_API_KEYS", "Alice=0123456789abcdef"},
		{"PROVISIONER_API_KEYS", "alice={{ secret:x:y }}-0123456789"},
		{"PROVISIONER_API_KEYS", "alice=0123456789abcdef,alice=0123456789abcdefg"},
		{"PROVISIONER_API_KEYS", "alice=0123456789abcdef,bob=0123456789abcdef"},
		{"PROVISIONER_ADMINS", "system:serviceaccount:ns:*"},
		{"PROVISIONER_ADMINS", "Bob"},
		{"PROVISIONER_PRINCIPAL_OPERATIONS", "alice=create,fly"},
		{"PROVISIONER_PRINCIPAL_OPERATIONS", "alice"},
		{"PROVISIONER_PRINCIPAL_OPERATIONS", "alice=get;alice=list"},
		{"PROVISIONER_PRINCIPAL_OPERATIONS", "system:serviceaccount:ns:*=get"},
		{"MAX_SANDBOXES_PER_PRINCIPAL", "-1"},
		{"AUTH_TOKEN_REVIEW_QPS", "0"},
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

// TestAuthDisabledRefusedWhenDeployed: under Knative queue-proxy reaches
// the container over loopback, and in a cluster every Pod that reaches this
// one would pass, so the switch is refused there whatever LISTEN_ADDRESS is,
// with a message naming it.
func TestAuthDisabledRefusedWhenDeployed(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string // part of the error, "" for none
	}{
		{env: map[string]string{}, want: ""},
		{env: map[string]string{"K_SERVICE": "sandbox-provisioner"}, want: "PROVISIONER_AUTH_DISABLED: is a development switch and is refused under Knative"},
		{env: map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, want: "PROVISIONER_AUTH_DISABLED: is a development switch and is refused in a cluster"},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			t.Setenv("PROVISIONER_AUTH_DISABLED", "true")
			t.Setenv("LISTEN_ADDRESS", "127.0.0.1:8080")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Load() = %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Load() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseAPIKeys(t *testing.T) {
	tests := []struct {
		raw, single string
		want        map[string]string
		err         string
	}{
		{raw: "", single: "", want: map[string]string{}},
		{raw: "", single: "the-single-key-0123", want: map[string]string{"default": "the-single-key-0123"}},
		// A key is trimmed, as every entry's value is (a header cannot
		// carry its leading space anyway), and keeps its own '='.
		{raw: " alice = alice-key-0123456789=, bob=bob-key-0123456789ab ", single: "the-single-key-0123",
			want: map[string]string{"alice": "alice-key-0123456789=", "bob": "bob-key-0123456789ab", "default": "the-single-key-0123"}},
		{raw: "default=another-key-0123456789", err: "PROVISIONER_API_KEY's principal"},
		{raw: "default=another-key-0123456789", single: "the-single-key-0123", err: "PROVISIONER_API_KEY's principal"},
		{raw: "anonymous=another-key-0123456789", err: "PROVISIONER_AUTH_DISABLED"},
		{raw: "alice=the-single-key-0123", single: "the-single-key-0123", err: "same key as PROVISIONER_API_KEY"},
		{raw: "a.b=0123456789abcdef", err: "lowercase"},
		{raw: "alice=", err: `PROVISIONER_API_KEYS: entry "alice=" must be name=key`},
		{raw: "alice=alice-key-0123456789,alice=other-key-0123456789", err: `PROVISIONER_API_KEYS: name "alice" is listed twice`},
		{raw: "alice=alice-key-0123456789,bob=alice-key-0123456789", err: `name "bob": it has the same key as "alice"`},
		{raw: "alice=short", err: `name "alice": its key is shorter than 16 bytes`},
		{raw: "alice={{ .Key }}-0123456789", err: "unexpanded template"},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			got, err := ParseAPIKeys(tc.raw, tc.single)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseAPIKeys (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParsePrincipalOperations(t *testing.T) {
	got, err := ParsePrincipalOperations(`
		system:serviceaccount:deer-flow:create-oidc=create;
		system:serviceaccount:deer-flow:ping=reap ;alice = get, list, get; *=get`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"system:serviceaccount:deer-flow:create-oidc": {"create"},
		"system:serviceaccount:deer-flow:ping":        {"reap"},
		"alice":                                       {"get", "list"},
		"*":                                           {"get"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePrincipalOperations (-want +got):\n%s", diff)
	}
}

func TestParsePrincipalGroups(t *testing.T) {
	const c, d = "system:serviceaccount:deer-flow:create-oidc", "system:serviceaccount:deer-flow:destroy-oidc"
	tests := []struct {
		name, raw string
		want      map[string]string
		err       string
	}{
		{name: "unset", raw: "", want: map[string]string{}},
		{name: "two groups", raw: " events = " + c + ", " + d + " ; team=alice,bob",
			want: map[string]string{c: "events", d: "events", "alice": "team", "bob": "team"}},
		{name: "the key's own principal as the group", raw: "default=" + c, want: map[string]string{c: "default"}},
		{name: "no members", raw: "events=", err: "must be group=member"},
		{name: "no equals sign", raw: "events", err: "must be group=member"},
		{name: "a member in two groups", raw: "a=" + c + ";b=" + c, err: "is in groups"},
		{name: "a group twice", raw: "a=alice;a=bob", err: "listed twice"},
		{name: "a wildcard is no member", raw: "a=system:serviceaccount:deer-flow:*", err: "is not a principal"},
		{name: "a group that is also a member", raw: "a=b;c=a", err: "both a group and a member"},
		{name: "a group named anonymous", raw: "anonymous=" + c, err: "PROVISIONER_AUTH_DISABLED"},
		{name: "anonymous as a member", raw: "events=anonymous", err: "PROVISIONER_AUTH_DISABLED"},
		{name: "a group named like a service account", raw: c + "=" + d, err: "a token's principal"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePrincipalGroups(tc.raw)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParsePrincipalGroups (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPrincipalNamesMayNotCollide: start-up refuses a key or group whose
// name is another principal's ("default" but for PROVISIONER_API_KEY's
// own, "anonymous", a key's name as a group's), naming the variable; the
// documented group "default" (event-made sandboxes as the backend's own)
// stays.
func TestPrincipalNamesMayNotCollide(t *testing.T) {
	const key, alice, bob = "the-single-key-0123", "alice-key-0123456789", "bob-key-0123456789ab"
	const sa = "system:serviceaccount:deer-flow:create-oidc"
	tests := []struct {
		name string
		env  map[string]string
		want string // the variable the error names, and part of its message; "" for none
	}{
		{name: "keys and a group of their own", env: map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_API_KEYS": "alice=" + alice + ",bob=" + bob,
			"PROVISIONER_PRINCIPAL_GROUPS": "team=alice,bob;events=" + sa}},
		{name: "group default joins PROVISIONER_API_KEY's principal", env: map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_PRINCIPAL_GROUPS": "default=" + sa}},
		{name: "a key named default", env: map[string]string{"PROVISIONER_API_KEYS": "default=" + alice},
			want: "PROVISIONER_API_KEYS: key name \"default\" is PROVISIONER_API_KEY's principal"},
		{name: "a key named default beside PROVISIONER_API_KEY", env: map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_API_KEYS": "default=" + alice},
			want: "PROVISIONER_API_KEYS: key name \"default\" is PROVISIONER_API_KEY's principal"},
		{name: "a key named anonymous", env: map[string]string{"PROVISIONER_API_KEYS": "anonymous=" + alice},
			want: "PROVISIONER_API_KEYS: key name \"anonymous\""},
		{name: "a group named like a key", env: map[string]string{"PROVISIONER_API_KEYS": "alice=" + alice + ",bob=" + bob, "PROVISIONER_PRINCIPAL_GROUPS": "alice=bob"},
			want: "PROVISIONER_PRINCIPAL_GROUPS: group \"alice\" has the name of a key in PROVISIONER_API_KEYS"},
		{name: "a group named like a key that is its member", env: map[string]string{"PROVISIONER_API_KEYS": "alice=" + alice + ",bob=" + bob, "PROVISIONER_PRINCIPAL_GROUPS": "alice=alice,bob"},
			want: "PROVISIONER_PRINCIPAL_GROUPS: group \"alice\" has the name of a key in PROVISIONER_API_KEYS"},
		{name: "group default without PROVISIONER_API_KEY", env: map[string]string{"PROVISIONER_API_KEYS": "alice=" + alice, "PROVISIONER_PRINCIPAL_GROUPS": "default=alice"},
			want: "PROVISIONER_PRINCIPAL_GROUPS: group \"default\" is PROVISIONER_API_KEY's principal, which is unset"},
		{name: "a group named anonymous", env: map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_PRINCIPAL_GROUPS": "anonymous=" + sa},
			want: "PROVISIONER_PRINCIPAL_GROUPS: group name \"anonymous\""},
		{name: "anonymous as a member", env: map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_PRINCIPAL_GROUPS": "events=anonymous"},
			want: "PROVISIONER_PRINCIPAL_GROUPS: group \"events\": \"anonymous\""},
		{name: "a group named like a service account", env: map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_PRINCIPAL_GROUPS": sa + "=default"},
			want: "PROVISIONER_PRINCIPAL_GROUPS: group name \"" + sa + "\" must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if tc.want == "" {
				if diff := cmp.Diff("", got); diff != "" {
					t.Errorf("Load() error (-want +got):\n%s", diff)
				}
				return
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("Load() error %q, want one containing %q", got, tc.want)
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

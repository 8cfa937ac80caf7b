package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

func TestValidateCreateRequest(t *testing.T) {
	cfg := testConfig(t, nil)
	now := created
	base := func(mod func(*Spec)) Spec {
		s := Spec{ID: "abcd1234", ThreadID: "abcd1234", UserID: "default", IdleTimeout: time.Hour, MaxLifetime: 24 * time.Hour,
			CPULimit: resource.MustParse("1"), MemoryLimit: resource.MustParse("1Gi"), Now: now, Mounts: []Mount{}}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	tests := []struct {
		name    string
		body    string
		want    Spec
		wantErr string // substring of the detail; "" means accepted
		kind    Kind
	}{{
		name: "anonymous DeerFlow create: null thread means the sandbox id",
		body: `{"sandbox_id":"abcd1234","thread_id":null,"user_id":"default","include_legacy_skills":true,"provision_lark_cli_runtime":false}`,
		want: base(func(s *Spec) { s.IncludeLegacySkills = true }),
	}, {
		name: "unknown fields are ignored",
		body: `{"sandbox_id":"abcd1234","future_field":{"x":1}}`,
		want: base(nil),
	}, {
		name: "lark flags without configured images are dropped, as capabilities say",
		body: `{"sandbox_id":"abcd1234","provision_lark_cli_runtime":true,"provision_lark_cli_broker":true}`,
		want: base(nil),
	}, {
		name: "extra mount read_only defaults to true",
		body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","max_shell_sessions":3,"extra_mounts":[{"host_path":"/.deer-flow/x","container_path":"/mnt/acp-workspace"}]}`,
		want: base(func(s *Spec) {
			s.ThreadID, s.UserID, s.MaxShellSessions = "t1", "u1", 3
			s.Mounts = []Mount{{HostPath: "/.deer-flow/x", ContainerPath: "/mnt/acp-workspace", ReadOnly: true}}
		}),
	}, {
		name: "per-request lifetime and resources within bounds",
		body: `{"sandbox_id":"abcd1234","idle_timeout_seconds":60,"max_lifetime_seconds":120,"cpu":"2","memory":"2Gi"}`,
		want: base(func(s *Spec) {
			s.IdleTimeout, s.MaxLifetime = time.Minute, 2*time.Minute
			s.CPULimit, s.MemoryLimit = resource.MustParse("2"), resource.MustParse("2Gi")
			s.Requested = Requested{IdleTimeout: true, MaxLifetime: true, CPU: true, Memory: true}
		}),
	}, {
		name: "a template by name", body: `{"sandbox_id":"abcd1234","template":"python"}`,
		want: base(func(s *Spec) { s.Template = "python" }),
	}, {
		name: "a template name that cannot name an object", body: `{"sandbox_id":"abcd1234","template":"../Python"}`,
		wantErr: `template "../Python" must be the name of a sandbox template`, kind: KindInvalid,
	}, {
		name: "idle timeout over the operator bound", body: `{"sandbox_id":"abcd1234","idle_timeout_seconds":999999}`,
		wantErr: "idle_timeout_seconds", kind: KindInvalid,
	}, {
		name: "memory under the request", body: `{"sandbox_id":"abcd1234","memory":"1Mi"}`,
		wantErr: "memory", kind: KindInvalid,
	}, {
		name: "scientific quantities are refused before they are compared (slow)", body: `{"sandbox_id":"abcd1234","cpu":"1E99999999"}`,
		wantErr: "plain quantity", kind: KindInvalid,
	}, {
		name: "host path equal to the base dir", body: `{"sandbox_id":"abcd1234","extra_mounts":[{"host_path":"/.deer-flow","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "must lie under", kind: KindInvalid,
	}, {
		name: "host path with a trailing slash", body: `{"sandbox_id":"abcd1234","extra_mounts":[{"host_path":"/.deer-flow/x/","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "clean path", kind: KindInvalid,
	}, {
		name: "host path with a dot segment", body: `{"sandbox_id":"abcd1234","extra_mounts":[{"host_path":"/.deer-flow/./x","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "clean path", kind: KindInvalid,
	}, {
		name: "container path with a trailing slash", body: `{"sandbox_id":"abcd1234","extra_mounts":[{"host_path":"/.deer-flow/x","container_path":"/mnt/acp-workspace/"}]}`,
		wantErr: "not allowed", kind: KindInvalid,
	}, {
		name: "host path under another user's directory", body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/users/u2/skills_view/custom","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "outside the requesting user's directory", kind: KindInvalid,
	}, {
		name: "host path under another thread of the same user", body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/users/u1/threads/t2/acp-workspace","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "outside the requesting thread's directory", kind: KindInvalid,
	}, {
		name: "host path under every user's data", body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/users","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "outside the requesting user's directory", kind: KindInvalid,
	}, {
		name: "host path under the threads directory of a user", body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/users/u1/threads","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "outside the requesting thread's directory", kind: KindInvalid,
	}, {
		name: "host path under another thread's legacy directory", body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/threads/t2/user-data","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "outside the requesting thread's directory", kind: KindInvalid,
	}, {
		name: "host path under all threads' legacy directories", body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/threads","container_path":"/mnt/acp-workspace"}]}`,
		wantErr: "outside the requesting thread's directory", kind: KindInvalid,
	}, {
		name: "host paths of the requesting user and thread",
		body: `{"sandbox_id":"abcd1234","thread_id":"t1","user_id":"u1","extra_mounts":[{"host_path":"/.deer-flow/users/u1/threads/t1/acp-workspace","container_path":"/mnt/acp-workspace"},{"host_path":"/.deer-flow/users/u1/skills_view/custom","container_path":"/mnt/skills/custom"},{"host_path":"/.deer-flow/threads/t1/lark","container_path":"/mnt/integrations/lark-cli/data","read_only":false},{"host_path":"/.deer-flow/users-archive/x","container_path":"/mnt/skills/integrations"}]}`,
		want: base(func(s *Spec) {
			s.ThreadID, s.UserID = "t1", "u1"
			s.Mounts = []Mount{
				{HostPath: "/.deer-flow/users/u1/threads/t1/acp-workspace", ContainerPath: "/mnt/acp-workspace", ReadOnly: true},
				{HostPath: "/.deer-flow/users/u1/skills_view/custom", ContainerPath: "/mnt/skills/custom", ReadOnly: true},
				{HostPath: "/.deer-flow/threads/t1/lark", ContainerPath: "/mnt/integrations/lark-cli/data", ReadOnly: false},
				{HostPath: "/.deer-flow/users-archive/x", ContainerPath: "/mnt/skills/integrations", ReadOnly: true},
			}
		}),
	}, {
		name: "env: plain values, kept as sent",
		body: `{"sandbox_id":"abcd1234","env":{"OPENAI_API_KEY":"sk-1","_X":"","A1":"$(HOME) and $$"}}`,
		want: base(func(s *Spec) { s.Env = map[string]string{"OPENAI_API_KEY": "sk-1", "_X": "", "A1": "$(HOME) and $$"} }),
	}, {
		name: "env: empty map is none", body: `{"sandbox_id":"abcd1234","env":{}}`,
		want: base(nil),
	}, {
		name: "env: a reference instead of a value", body: `{"sandbox_id":"abcd1234","env":{"TOKEN":{"valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}}}`,
		wantErr: "env.TOKEN must be a JSON string: values only, never references", kind: KindInvalid,
	}, {
		name: "env: a number", body: `{"sandbox_id":"abcd1234","env":{"N":1}}`,
		wantErr: "env.N must be a JSON string", kind: KindInvalid,
	}, {
		name: "env: not a map", body: `{"sandbox_id":"abcd1234","env":["A=1"]}`,
		wantErr: `field "env" must be a JSON object of names to string values`, kind: KindInvalid,
	}, {
		name: "env: lower-case name", body: `{"sandbox_id":"abcd1234","env":{"path":"x"}}`,
		wantErr: `env name "path" must be upper-case letters`, kind: KindInvalid,
	}, {
		name: "env: name starting with a digit", body: `{"sandbox_id":"abcd1234","env":{"1A":"x"}}`,
		wantErr: `env name "1A"`, kind: KindInvalid,
	}, {
		name: "env: the provisioner's MAX_SHELL_SESSIONS", body: `{"sandbox_id":"abcd1234","env":{"MAX_SHELL_SESSIONS":"99"}}`,
		wantErr: "env.MAX_SHELL_SESSIONS is reserved (the provisioner sets it)", kind: KindInvalid,
	}, {
		name: "env: DeerFlow's names", body: `{"sandbox_id":"abcd1234","env":{"DEER_FLOW_HOME":"x"}}`,
		wantErr: "env.DEER_FLOW_HOME is reserved", kind: KindInvalid,
	}, {
		name: "env: Kubernetes' names", body: `{"sandbox_id":"abcd1234","env":{"KUBERNETES_SERVICE_HOST":"10.0.0.1"}}`,
		wantErr: "env.KUBERNETES_SERVICE_HOST is reserved (Kubernetes sets names of this form)", kind: KindInvalid,
	}, {
		name: "env: a service link name", body: `{"sandbox_id":"abcd1234","env":{"REDIS_SERVICE_PORT_HTTP":"1"}}`,
		wantErr: "env.REDIS_SERVICE_PORT_HTTP is reserved", kind: KindInvalid,
	}, {
		name: "env: PATH", body: `{"sandbox_id":"abcd1234","env":{"PATH":"/tmp"}}`,
		wantErr: "env.PATH is reserved (it changes how the sandbox itself starts)", kind: KindInvalid,
	}, {
		name: "env: the dynamic loader", body: `{"sandbox_id":"abcd1234","env":{"LD_PRELOAD":"/tmp/x.so"}}`,
		wantErr: "env.LD_PRELOAD is reserved", kind: KindInvalid,
	}, {
		name: "env: NUL in a value", body: `{"sandbox_id":"abcd1234","env":{"A":"x\u0000y"}}`,
		wantErr: "env.A contains a NUL byte", kind: KindInvalid,
	}, {
		name: "env: the first bad entry by name is named", body: `{"sandbox_id":"abcd1234","env":{"ZZ":"ok","PATH":"x","B b":"x"}}`,
		wantErr: `env name "B b"`, kind: KindInvalid,
	}, {
		name: "env: 33 entries", body: envBody(33, 4, 1),
		wantErr: "env has 33 entries; at most 32", kind: KindInvalid,
	}, {
		name: "env: a 129-byte name", body: `{"sandbox_id":"abcd1234","env":{"` + strings.Repeat("N", 129) + `":"x"}}`,
		wantErr: "is 129 bytes; at most 128", kind: KindInvalid,
	}, {
		name: "env: a value over 4 KiB", body: `{"sandbox_id":"abcd1234","env":{"BIG":"` + strings.Repeat("v", 4097) + `"}}`,
		wantErr: "env.BIG is 4097 bytes; at most 4096", kind: KindInvalid,
	}, {
		name: "env: 32 entries of exactly 32 KiB in total", body: envBody(32, 28, 996),
		want: base(func(s *Spec) { s.Env = envMap(32, 28, 996) }),
	}, {
		name: "env: over 32 KiB in total", body: envBody(32, 28, 1010),
		wantErr: "env totals 33216 bytes of names and values; at most 32768", kind: KindInvalid,
	}, {
		name: "id of 52 characters does not fit the Service name", body: `{"sandbox_id":"` + strings.Repeat("a", 52) + `"}`,
		wantErr: "at most 51", kind: KindInvalid,
	}, {
		name: "body is an array", body: `[1]`, wantErr: "must be a JSON object", kind: KindInvalid,
	}, {
		name: "body is not JSON", body: `sandbox_id=x`, wantErr: "not valid JSON", kind: KindMalformed,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := DecodeCreateRequest([]byte(tc.body))
			var got Spec
			if err == nil {
				got, err = req.Validate(cfg.Objects(), now)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(DetailOf(err), tc.wantErr) || KindOf(err) != tc.kind {
					t.Fatalf("error = %v (kind %v), want kind %v containing %q", err, KindOf(err), tc.kind, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Spec (-want +got):\n%s", diff)
			}
		})
	}
}

// envMap is n entries whose names are nameLen bytes and values valueLen.
func envMap(n, nameLen, valueLen int) map[string]string {
	env := map[string]string{}
	for i := range n {
		name := fmt.Sprintf("E%03d", i)
		env[name+strings.Repeat("_", nameLen-len(name))] = strings.Repeat("v", valueLen)
	}
	return env
}

func envBody(n, nameLen, valueLen int) string {
	raw, _ := json.Marshal(map[string]any{"sandbox_id": "abcd1234", "env": envMap(n, nameLen, valueLen)})
	return string(raw)
}

func TestEnvAgainstTemplate(t *testing.T) {
	tpl := &template.Template{Name: "python", Pod: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: template.ContainerName, Env: []corev1.EnvVar{{Name: "HTTP_PROXY", Value: "http://proxy:3128"}}},
		{Name: "sidecar", Env: []corev1.EnvVar{{Name: "SIDECAR_ONLY", Value: "1"}}},
	}}}}
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{name: "no env"},
		{name: "names the template leaves alone, a sidecar's included", env: map[string]string{"API_KEY": "k", "SIDECAR_ONLY": "2"}},
		{name: "a name the template's sandbox container sets", env: map[string]string{"API_KEY": "k", "HTTP_PROXY": "http://evil"},
			wantErr: `env.HTTP_PROXY is set by sandbox template "python"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckEnvAgainstTemplate(tpl, tc.env)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || KindOf(err) != KindInvalid || !strings.Contains(DetailOf(err), tc.wantErr) {
				t.Fatalf("error = %v, want an invalid-request error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestExtraMountsAboveTenantRoots: with THREADS_HOST_PATH nested below the
// base (<base>/data/threads), an extra mount of a directory above it would
// hold every thread's tree; it is refused as the roots themselves are,
// naming the entry, while the caller's own thread and a sibling of the
// root (shared, read-only) stay mountable.
func TestExtraMountsAboveTenantRoots(t *testing.T) {
	cfg := testConfig(t, map[string]string{"THREADS_HOST_PATH": "/.deer-flow/data/threads"})
	type result struct {
		Mounts []Mount
		Detail string
	}
	tests := []struct {
		name     string
		hostPath string
		want     result
	}{
		{name: "the parent of the nested threads root", hostPath: "/.deer-flow/data",
			want: result{Detail: `extra_mounts[0].host_path "/.deer-flow/data" holds /.deer-flow/data/threads, where every tenant's data is; a sandbox may mount only its own user's and thread's data`}},
		{name: "the threads root itself", hostPath: "/.deer-flow/data/threads",
			want: result{Detail: `extra_mounts[0].host_path "/.deer-flow/data/threads" lies outside the requesting thread's directory; a sandbox may mount only its own user's and thread's data`}},
		{name: "another thread's tree", hostPath: "/.deer-flow/data/threads/t2",
			want: result{Detail: `extra_mounts[0].host_path "/.deer-flow/data/threads/t2" lies outside the requesting thread's directory; a sandbox may mount only its own user's and thread's data`}},
		{name: "the users root", hostPath: "/.deer-flow/users",
			want: result{Detail: `extra_mounts[0].host_path "/.deer-flow/users" lies outside the requesting user's directory; a sandbox may mount only its own user's and thread's data`}},
		{name: "the caller's own thread", hostPath: "/.deer-flow/data/threads/t1/lark",
			want: result{Mounts: []Mount{{HostPath: "/.deer-flow/data/threads/t1/lark", ContainerPath: "/mnt/acp-workspace", ReadOnly: true}}}},
		{name: "a sibling of the threads root", hostPath: "/.deer-flow/data/shared",
			want: result{Mounts: []Mount{{HostPath: "/.deer-flow/data/shared", ContainerPath: "/mnt/acp-workspace", ReadOnly: true}}}},
		{name: "a name that only starts like the root's parent", hostPath: "/.deer-flow/dat",
			want: result{Mounts: []Mount{{HostPath: "/.deer-flow/dat", ContainerPath: "/mnt/acp-workspace", ReadOnly: true}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := CreateRequest{SandboxID: "abcd1234", UserID: new("u1"), ThreadID: new("t1"),
				ExtraMounts: []ExtraMount{{HostPath: tc.hostPath, ContainerPath: "/mnt/acp-workspace"}}}
			s, err := req.Validate(cfg.Objects(), created)
			got := result{Mounts: s.Mounts}
			if err != nil {
				if KindOf(err) != KindInvalid {
					t.Fatalf("error %v: want an invalid request", err)
				}
				got.Detail = DetailOf(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("validation (-want +got):\n%s", diff)
			}
		})
	}
}

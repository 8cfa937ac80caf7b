package sandbox

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
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
				got, err = req.Validate(cfg, now)
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

func TestValidateIDBoundary(t *testing.T) {
	ok := strings.Repeat("a", maxIDLen)
	if err := ValidateID(ok); err != nil {
		t.Errorf("ValidateID(%d chars) = %v", len(ok), err)
	}
	if got := len(ServiceName(ok)); got != 63 {
		t.Errorf("longest id gives a Service name of %d characters, want 63", got)
	}
	if err := ValidateID(ok + "a"); err == nil {
		t.Errorf("ValidateID accepted %d characters", len(ok)+1)
	}
}

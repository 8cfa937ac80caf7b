package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCreatingPrincipals: the principals that may create, as a create
// would be judged: each key's and each allowed subject's own name, or its
// group's; less those PROVISIONER_PRINCIPAL_OPERATIONS keeps from create.
func TestCreatingPrincipals(t *testing.T) {
	const key, alice, bob = "the-single-key-0123", "alice-key-0123456789", "bob-key-0123456789ab"
	const create, reaper = "system:serviceaccount:deer-flow:create-trigger", "system:serviceaccount:deer-flow:reaper"
	tests := []struct {
		name string
		auth AuthConfig
		want []string
		many bool
	}{
		{name: "DeerFlow's single key", auth: AuthConfig{APIKey: key}, want: []string{"default"}},
		{name: "named keys", auth: AuthConfig{APIKey: key, APIKeys: "alice=" + alice + ",bob=" + bob}, want: []string{"alice", "bob", "default"}},
		{name: "a group is one principal", auth: AuthConfig{APIKeys: "alice=" + alice + ",bob=" + bob, PrincipalGroups: "team=alice,bob"}, want: []string{"team"}},
		{name: "the shipped shape: Triggers grouped as default, the PingSource reaps", auth: AuthConfig{APIKey: key, TokenAudience: "a",
			AllowedSubjects: []string{create, reaper}, PrincipalGroups: "default=" + create,
			PrincipalOperations: create + "=create;" + reaper + "=reap"}, want: []string{"default"}},
		{name: "Triggers in a group of their own", auth: AuthConfig{APIKey: key, TokenAudience: "a",
			AllowedSubjects: []string{create}, PrincipalGroups: "events=" + create}, want: []string{"default", "events"}},
		{name: "subjects count only with an audience", auth: AuthConfig{APIKey: key, AllowedSubjects: []string{create}}, want: []string{"default"}},
		{name: "a key kept from create", auth: AuthConfig{APIKey: key, APIKeys: "alice=" + alice, PrincipalOperations: "alice=get,list"}, want: []string{"default"}},
		{name: "every unlisted principal kept from create", auth: AuthConfig{APIKey: key, APIKeys: "alice=" + alice, PrincipalOperations: "*=get;default=create"}, want: []string{"default"}},
		{name: "a wildcard subject that may create", auth: AuthConfig{APIKey: key, TokenAudience: "a", AllowedSubjects: []string{"system:serviceaccount:team:*"}},
			want: []string{"default"}, many: true},
		{name: "a wildcard subject kept from create", auth: AuthConfig{APIKey: key, TokenAudience: "a", AllowedSubjects: []string{"system:serviceaccount:team:*"},
			PrincipalOperations: "*=get;default=create"}, want: []string{"default"}},
		// Issue 45, finding 2: auth lets a service account that the
		// operations name create under a wildcard whose "*" may not, so
		// it is a tenant beside the key.
		{name: "a creator named under a wildcard subject kept from create", auth: AuthConfig{APIKey: key, TokenAudience: "a",
			AllowedSubjects:     []string{"system:serviceaccount:team:*"},
			PrincipalOperations: "*=get;default=create;system:serviceaccount:team:builder=create"},
			want: []string{"default", "system:serviceaccount:team:builder"}},
		{name: "a creator named under a wildcard subject, in a group", auth: AuthConfig{APIKey: key, TokenAudience: "a",
			AllowedSubjects: []string{"system:serviceaccount:team:*"}, PrincipalGroups: "builders=system:serviceaccount:team:builder",
			PrincipalOperations: "*=get;default=create;system:serviceaccount:team:builder=create"},
			want: []string{"builders", "default"}},
		{name: "a named account under the wildcard that may not create", auth: AuthConfig{APIKey: key, TokenAudience: "a",
			AllowedSubjects: []string{"system:serviceaccount:team:*"}, PrincipalGroups: "builders=system:serviceaccount:team:viewer",
			PrincipalOperations: "*=get;default=create;system:serviceaccount:team:builder=get,list"},
			want: []string{"default"}},
		{name: "a creator of a namespace no subject admits", auth: AuthConfig{APIKey: key, TokenAudience: "a",
			AllowedSubjects:     []string{"system:serviceaccount:team:*"},
			PrincipalOperations: "*=get;default=create;system:serviceaccount:other:builder=create"},
			want: []string{"default"}},
		{name: "auth disabled: one administrator", auth: AuthConfig{AuthDisabled: true, APIKeys: "alice=" + alice}, want: []string{"anonymous"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, many := tc.auth.CreatingPrincipals()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("principals (-want +got):\n%s", diff)
			}
			if many != tc.many {
				t.Errorf("many = %v, want %v", many, tc.many)
			}
			if multi := tc.auth.MultiplePrincipals(); multi != (tc.many || len(tc.want) > 1) {
				t.Errorf("MultiplePrincipals() = %v for %v (many %v)", multi, tc.want, tc.many)
			}
		})
	}
}

// TestSharedClaimsRefusedBetweenPrincipals (issue 29, item 5): with more
// than one principal, start-up refuses a skills claim mounted whole (or by
// a template without {user_id}) and a shared user-data claim, each with a
// message saying what to set; with the single key both stay, as DeerFlow.
func TestSharedClaimsRefusedBetweenPrincipals(t *testing.T) {
	const key, alice = "the-single-key-0123", "alice-key-0123456789"
	two := map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_API_KEYS": "alice=" + alice}
	with := func(base map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range base {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	tests := []struct {
		name string
		env  map[string]string
		want []string // parts of the error, in order; none: it loads
	}{
		{name: "single key, whole skills claim and user-data claim (DeerFlow)",
			env: map[string]string{"PROVISIONER_API_KEY": key, "SKILLS_PVC_NAME": "skills", "USERDATA_PVC_NAME": "data"}},
		{name: "two principals in host-path mode", env: two},
		{name: "two principals, skills claim per user", env: with(two, "SKILLS_PVC_NAME", "skills", "SKILLS_PVC_SUBPATH_TEMPLATE", "skills/{user_id}")},
		{name: "two principals, whole skills claim", env: with(two, "SKILLS_PVC_NAME", "skills"),
			want: []string{"SKILLS_PVC_SUBPATH_TEMPLATE: must be set, with {user_id} in it", "(alice, default)", "skills/{user_id}"}},
		{name: "two principals, skills template shared by every user", env: with(two, "SKILLS_PVC_NAME", "skills", "SKILLS_PVC_SUBPATH_TEMPLATE", "public"),
			want: []string{"SKILLS_PVC_SUBPATH_TEMPLATE: must be set, with {user_id} in it"}},
		{name: "two principals, user-data claim", env: with(two, "USERDATA_PVC_NAME", "data"),
			want: []string{"USERDATA_PVC_NAME: is refused while more than one principal may create sandboxes (alice, default)", "unset it", "DEER_FLOW_HOST_BASE_DIR"}},
		{name: "a wildcard subject is many principals", env: map[string]string{"PROVISIONER_API_KEY": key, "USERDATA_PVC_NAME": "data",
			"AUTH_TOKEN_AUDIENCE": "a", "AUTH_ALLOWED_SUBJECTS": "system:serviceaccount:team:*"},
			want: []string{"USERDATA_PVC_NAME", "(default and every service account of a wildcard subject in AUTH_ALLOWED_SUBJECTS)"}},
		{name: "Triggers grouped as default keep one principal", env: map[string]string{"PROVISIONER_API_KEY": key, "USERDATA_PVC_NAME": "data", "SKILLS_PVC_NAME": "skills",
			"AUTH_TOKEN_AUDIENCE": "a", "AUTH_ALLOWED_SUBJECTS": "system:serviceaccount:deer-flow:create", "PROVISIONER_PRINCIPAL_GROUPS": "default=system:serviceaccount:deer-flow:create"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("loaded; want a refusal with %q", tc.want)
			}
			rest := err.Error()
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("the refusal %q lacks %q (in order)", err, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

package auth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// TestReapIsGranted: the reap judges every principal's sandboxes, so it is
// an operation a principal must be granted. config/'s deployment keeps it
// (DeerFlow's single key, the PingSource listed with reap); a named key
// beside it may not reap, and with it "default" may not either, unless
// PROVISIONER_PRINCIPAL_OPERATIONS grants it or the principal is an
// administrator. Every other operation stays as it was.
func TestReapIsGranted(t *testing.T) {
	now := time.Now()
	const (
		pingSA   = "system:serviceaccount:deer-flow:sandbox-reaper-oidc-sources.knative.dev-pingsource"
		createSA = "system:serviceaccount:deer-flow:sandbox-provisioner-create-oidc-eventing.knative.dev-trigger"
		alice    = "alice-key-0123456789"
		ops      = "ops-key-0123456789ab"
	)
	pingToken, createToken := jwt("aud", now.Add(time.Hour)), jwt("aud", now.Add(time.Hour+time.Second))
	reviewer := &fakeReviewer{tokens: map[string]Review{
		pingToken:   {Authenticated: true, Username: pingSA, Audiences: []string{"aud"}},
		createToken: {Authenticated: true, Username: createSA, Audiences: []string{"aud"}},
	}}
	// config/400-service.yaml's settings, less the Triggers it does not
	// need here: the backend's key, the create Trigger grouped as its
	// principal, the PingSource limited to the reap.
	shipped := config.AuthConfig{APIKey: key, TokenAudience: "aud", AllowedSubjects: []string{pingSA, createSA},
		PrincipalOperations: createSA + "=create;" + pingSA + "=reap", PrincipalGroups: "default=" + createSA}
	withKeys := func(c config.AuthConfig, more map[string]string) config.AuthConfig {
		c.APIKeys = "alice=" + alice + ",ops=" + ops
		for k, v := range more {
			switch k {
			case "ops":
				c.PrincipalOperations += ";" + v
			case "admins":
				c.Admins = strings.Split(v, ",")
			}
		}
		return c
	}
	type call struct {
		who   string
		creds Credentials
		op    string
	}
	var (
		asDefault = call{"default", Credentials{Key: key}, "reap"}
		asPing    = call{"the PingSource", Credentials{Token: pingToken}, "reap"}
		asAlice   = call{"alice", Credentials{Key: alice}, "reap"}
		asOps     = call{"ops", Credentials{Key: ops}, "reap"}
	)
	tests := []struct {
		name  string
		auth  config.AuthConfig
		calls []call
		want  []int
	}{
		{name: "config/ as shipped: default and the PingSource reap", auth: shipped,
			calls: []call{asDefault, asPing}, want: []int{0, 0}},
		{name: "named keys: only the PingSource reaps", auth: withKeys(shipped, nil),
			calls: []call{asDefault, asPing, asAlice, asOps, {"alice", Credentials{Key: alice}, "create"}, {"default", Credentials{Key: key}, "list"}},
			want:  []int{403, 0, 403, 403, 0, 0}},
		{name: "named keys: an administrator reaps", auth: withKeys(shipped, map[string]string{"admins": "ops"}),
			calls: []call{asOps, asAlice}, want: []int{0, 403}},
		{name: "named keys: an entry grants it", auth: withKeys(shipped, map[string]string{"ops": "alice=create,get,reap;default=create,reap"}),
			calls: []call{asAlice, asDefault, asOps}, want: []int{0, 0, 403}},
		{name: "named keys: the wildcard entry grants it", auth: withKeys(shipped, map[string]string{"ops": "*=create,get,list,destroy,pause,resume,reap,templates,capabilities"}),
			calls: []call{asAlice, asOps}, want: []int{0, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := FromConfig(&tc.auth, reviewer)
			var got []int
			for _, c := range tc.calls {
				d := a.Check(context.Background(), c.creds, c.op)
				got = append(got, d.Code)
				if d.Code == 403 && (!strings.Contains(d.Detail, c.who) || !strings.Contains(d.Detail, "PROVISIONER_PRINCIPAL_OPERATIONS")) {
					t.Errorf("%s's refusal does not say who and what grants it: %s", c.who, d.Detail)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("codes (-want +got):\n%s", diff)
			}
		})
	}
}

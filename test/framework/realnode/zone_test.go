package realnode

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPublicZone(t *testing.T) {
	want := map[string][]string{
		"allowed.test":  {"203.0.113.10"},
		"www.wild.test": {"203.0.113.10"},
		"wild.test":     {"203.0.113.10"},
		"unlisted.test": {"203.0.113.10"},
		"granted.test":  {"203.0.113.10"},
		"rebind.test":   {"10.250.0.10"},
		"mixed.test":    {"203.0.113.10", "10.250.0.10"},
	}
	if diff := cmp.Diff(want, PublicZone()); diff != "" {
		t.Errorf("PublicZone (-want +got):\n%s", diff)
	}
	// The private address must be a host that answers: an off-node one.
	if got := PublicZone()[RebindName]; got[0] != OffNodeHosts[0].IP {
		t.Errorf("%s resolves to %v, not to the off-node host %s", RebindName, got, OffNodeHosts[0].IP)
	}
	if !strings.HasSuffix(WildName, strings.TrimPrefix(WildPattern, "*")) || strings.HasSuffix(WildApexName, strings.TrimPrefix(WildPattern, "*")) {
		t.Errorf("%s should match %s and %s should not", WildName, WildPattern, WildApexName)
	}
}

func TestZoneEnv(t *testing.T) {
	for _, tc := range []struct {
		zone map[string][]string
		want string
	}{
		{nil, ""},
		{map[string][]string{"b.test": {"192.0.2.1"}, "a.test": {"192.0.2.2", "192.0.2.3"}}, "a.test=192.0.2.2,192.0.2.3;b.test=192.0.2.1"},
	} {
		if got := ZoneEnv(tc.zone); got != tc.want {
			t.Errorf("ZoneEnv(%v) = %q, want %q", tc.zone, got, tc.want)
		}
	}
	want := "allowed.test=203.0.113.10;granted.test=203.0.113.10;mixed.test=203.0.113.10,10.250.0.10;rebind.test=10.250.0.10;unlisted.test=203.0.113.10;wild.test=203.0.113.10;www.wild.test=203.0.113.10"
	if got := PublicZoneEnv(); got != want {
		t.Errorf("PublicZoneEnv() = %q, want %q", got, want)
	}
	env := strings.Join(publicHostEnv(), "\n")
	for _, w := range []string{"SANDBOX_DNS_ZONE=" + want, "SANDBOX_TLS_ADDR=203.0.113.10:443", "SANDBOX_TLS_NAMES=allowed.test,granted.test,mixed.test,rebind.test,unlisted.test,wild.test,www.wild.test"} {
		if !strings.Contains(env, w) {
			t.Errorf("the public host's env lacks %q:\n%s", w, env)
		}
	}
}

package egress

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": Open, "open": Open, " isolated ": Isolated, "allowlist": Allowlist} {
		got, err := ParseMode(in)
		if err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"internet", "Open", "deny-all", "allow"} {
		if _, err := ParseMode(in); err == nil {
			t.Errorf("ParseMode(%q) accepted", in)
		}
	}
}

func TestParseNames(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "", want: []string{}},
		{in: "PyPI.org, *.github.com,pypi.org,files.pythonhosted.org.", want: []string{"*.github.com", "files.pythonhosted.org", "pypi.org"}},
		{in: "203.0.113.10", bad: true},
		{in: "[2001:db8::1]", bad: true},
		{in: "localhost", bad: true},
		{in: "example.com:443", bad: true},
		{in: "https://example.com", bad: true},
		{in: "a.*.example.com", bad: true},
		{in: "*", bad: true},
		{in: "*.com.", bad: true},
		{in: "-a.example.com", bad: true},
		{in: "example.com/path", bad: true},
	} {
		got, err := ParseNames(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("ParseNames(%q) = %v, want an error", c.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseNames(%q): %v", c.in, err)
			continue
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("ParseNames(%q) (-want +got):\n%s", c.in, diff)
		}
	}
}

func TestMatch(t *testing.T) {
	list := []string{"pypi.org", "*.github.com"}
	for host, want := range map[string]bool{
		"pypi.org": true, "PyPI.org.": true, "www.pypi.org": false, "xpypi.org": false,
		"api.github.com": true, "a.b.github.com": true, "github.com": false, "evilgithub.com": false,
		"github.com.evil.org": false, "": false,
	} {
		if got := Match(list, host); got != want {
			t.Errorf("Match(%v, %q) = %v, want %v", list, host, got, want)
		}
	}
}

func TestApplyGrantsAndAllows(t *testing.T) {
	now := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	in10, in20 := now.Add(10*time.Minute), now.Add(20*time.Minute)
	gs := ApplyGrants(nil, []string{"a.example.com", "b.example.com"}, &in10, false, now)
	gs = ApplyGrants(gs, []string{"a.example.com"}, &in20, false, now) // extends
	gs = ApplyGrants(gs, []string{"b.example.com"}, nil, false, now)   // lifetime wins
	gs = ApplyGrants(gs, []string{"c.example.com"}, &in10, false, now)
	gs = ApplyGrants(gs, []string{"c.example.com"}, nil, true, now) // revoked
	want := []Grant{{Name: "a.example.com", Until: &in20}, {Name: "b.example.com"}}
	if diff := cmp.Diff(want, gs); diff != "" {
		t.Fatalf("grants (-want +got):\n%s", diff)
	}
	back, err := DecodeGrants(EncodeGrants(gs))
	if err != nil || !cmp.Equal(gs, back) {
		t.Fatalf("round trip: %v, %v", back, err)
	}
	// Expired grants are dropped by the next change.
	if got := ApplyGrants(gs, nil, nil, false, now.Add(time.Hour)); len(got) != 1 || got[0].Name != "b.example.com" {
		t.Errorf("after an hour: %v", got)
	}

	p := Policy{Mode: Allowlist, Allow: []string{"pypi.org"}, Grants: gs}
	for _, c := range []struct {
		host string
		at   time.Time
		want bool
	}{
		{"pypi.org", now, true},
		{"a.example.com", now.Add(19 * time.Minute), true},
		{"a.example.com", now.Add(20 * time.Minute), false},
		{"b.example.com", now.Add(1000 * time.Hour), true},
		{"c.example.com", now, false},
	} {
		if got := p.Allows(c.host, c.at); got != c.want {
			t.Errorf("Allows(%q at %s) = %v, want %v", c.host, c.at, got, c.want)
		}
	}
	for _, m := range []Mode{Open, Isolated} {
		if (Policy{Mode: m, Allow: []string{"pypi.org"}}).Allows("pypi.org", now) {
			t.Errorf("a %s sandbox may use the proxy", m)
		}
	}
}

func TestJudge(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	extra := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	for _, c := range []struct {
		name    string
		answers []netip.Addr
		ok      bool
	}{
		{"public", addrs("203.0.113.10", "2001:db8::1"), true},
		{"none", nil, false},
		{"private", addrs("10.1.2.3"), false},
		{"mixed", addrs("203.0.113.10", "192.168.1.1"), false},
		{"metadata", addrs("169.254.169.254"), false},
		{"CGNAT", addrs("100.100.100.200"), false},
		{"loopback", addrs("127.0.0.1"), false},
		{"mapped private", addrs("::ffff:10.0.0.1"), false},
		{"unique local", addrs("fd00::1"), false},
		{"link-local v6", addrs("fe80::1"), false},
		{"the cluster's own public range", addrs("198.51.100.7"), false},
		{"this network", addrs("0.0.0.0"), false},
	} {
		got, why := Judge(c.answers, extra)
		if (why == "") != c.ok || (c.ok && len(got) != len(c.answers)) {
			t.Errorf("%s: Judge(%v) = %v, %q", c.name, c.answers, got, why)
		}
	}
}

// Package egress says what a sandbox may reach outside the cluster, in
// DeerFlow's three network modes:
//
//   - open: the internet minus private, link-local, CGNAT and metadata
//     ranges, and DNS through the cluster's DNS (the default, as before);
//   - isolated: nothing at all, DNS included;
//   - allowlist: nothing directly, DNS included; HTTP and HTTPS through the
//     egress proxy (package proxy), to the names on the sandbox's list.
//
// The mode is fixed when a sandbox is created (a label the NetworkPolicies
// select on); the list is the template's, widened at run time by grants.
// Everything here is pure: the function and the proxy share it.
package egress

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Mode is a sandbox's egress mode.
type Mode string

// The modes, by DeerFlow's names.
const (
	Open      Mode = "open"
	Isolated  Mode = "isolated"
	Allowlist Mode = "allowlist"
)

// Modes are the modes, in the order the documentation lists them.
var Modes = []Mode{Open, Isolated, Allowlist}

// ParseMode reads a mode; "" is open (what a sandbox made before modes has).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.TrimSpace(s)); m {
	case "":
		return Open, nil
	case Open, Isolated, Allowlist:
		return m, nil
	}
	return "", fmt.Errorf("egress mode %q: want open, isolated or allowlist", s)
}

// maxNames bounds a list: each name is checked on every connection, and the
// list lives in an annotation.
const maxNames = 256

// ParseNames reads a comma-separated list of names (see ValidName), in
// lower case, without duplicates, sorted.
func ParseNames(csv string) ([]string, error) {
	var names []string
	for _, f := range strings.Split(csv, ",") {
		if f = strings.TrimSpace(f); f != "" {
			names = append(names, f)
		}
	}
	return CleanNames(names)
}

// CleanNames checks each name, lowers it and returns the set sorted.
func CleanNames(names []string) ([]string, error) {
	out := make([]string, 0, len(names))
	for _, n := range names {
		n = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(n), "."))
		if err := ValidName(n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > maxNames {
		return nil, fmt.Errorf("%d names: at most %d", len(out), maxNames)
	}
	return out, nil
}

// ValidName accepts a DNS name of at least two labels ("example.com"), or
// one with a leading wildcard label ("*.example.com", any name below
// example.com, not example.com itself). It refuses IP literals, ports,
// schemes, paths and wildcards anywhere else.
func ValidName(n string) error {
	if _, err := netip.ParseAddr(strings.Trim(n, "[]")); err == nil {
		return fmt.Errorf("egress name %q is an IP address: name a host by its DNS name", n)
	}
	base := strings.TrimPrefix(n, "*.")
	if len(n) > 253 {
		return fmt.Errorf("egress name %q is longer than 253 characters", n)
	}
	labels := strings.Split(base, ".")
	if len(labels) < 2 {
		return fmt.Errorf("egress name %q: want a name with a dot, such as example.com or *.example.com", n)
	}
	for _, l := range labels {
		if !validLabel(l) {
			return fmt.Errorf("egress name %q: %q is not a DNS label (letters, digits and '-', 1 to 63 characters; a wildcard only as the leading '*.')", n, l)
		}
	}
	return nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, r := range l {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Match says whether host (a DNS name, any case, no port) is on the list:
// equal to a name, or below a "*." name on a label boundary
// ("*.example.com" matches "a.example.com" and "a.b.example.com", not
// "example.com" nor "badexample.com").
func Match(list []string, host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return false
	}
	for _, n := range list {
		if suffix, ok := strings.CutPrefix(n, "*"); ok {
			if strings.HasSuffix(host, suffix) && len(host) > len(suffix) {
				return true
			}
			continue
		}
		if host == n {
			return true
		}
	}
	return false
}

// Grant is a name added to one sandbox's list at run time, until a time
// (nil: for the sandbox's lifetime).
type Grant struct {
	Name  string     `json:"name"`
	Until *time.Time `json:"until,omitempty"`
}

// Live says whether g is in force at now.
func (g Grant) Live(now time.Time) bool { return g.Until == nil || now.Before(*g.Until) }

// DecodeGrants reads the grants annotation ("" is none).
func DecodeGrants(s string) ([]Grant, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var gs []Grant
	if err := json.Unmarshal([]byte(s), &gs); err != nil {
		return nil, fmt.Errorf("egress grants: %w", err)
	}
	return gs, nil
}

// EncodeGrants writes grants for the annotation ("" for none).
func EncodeGrants(gs []Grant) string {
	if len(gs) == 0 {
		return ""
	}
	b, _ := json.Marshal(gs) // a slice of plain structs always encodes
	return string(b)
}

// Grants applies one change to a sandbox's grants at now: names added
// until until (nil: its lifetime), or removed when revoke is set. A name
// granted again takes the later of its two ends. Grants no longer live
// are dropped, so the list does not grow without bound.
func ApplyGrants(gs []Grant, names []string, until *time.Time, revoke bool, now time.Time) []Grant {
	byName := map[string]Grant{}
	for _, g := range gs {
		if g.Live(now) {
			byName[g.Name] = g
		}
	}
	for _, n := range names {
		if revoke {
			delete(byName, n)
			continue
		}
		g, ok := byName[n]
		switch {
		case !ok, until == nil, g.Until != nil && until.After(*g.Until):
			g = Grant{Name: n, Until: until}
		}
		byName[n] = g
	}
	out := make([]Grant, 0, len(byName))
	for _, g := range byName {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Grant) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Policy is one sandbox's egress as the proxy judges it.
type Policy struct {
	Mode   Mode
	Allow  []string // the template's list (or the deployment's)
	Grants []Grant
	// Principal owns the sandbox (its label's value): the egress proxy
	// bounds the connections of each principal's sandboxes together.
	Principal string
}

// Allows says whether the sandbox may reach host at now: only an
// allowlist sandbox, and only a name on its list or granted and live.
func (p Policy) Allows(host string, now time.Time) bool {
	if p.Mode != Allowlist {
		return false
	}
	if Match(p.Allow, host) {
		return true
	}
	for _, g := range p.Grants {
		if g.Live(now) && Match([]string{g.Name}, host) {
			return true
		}
	}
	return false
}

// forbidden are the ranges no proxied connection may reach, whatever a
// name resolves to: where the cluster, the node and the clouds' metadata
// live. The specific metadata addresses lie in these ranges but are named
// for the reason a refusal gives.
var forbidden = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "a cloud metadata address"},
	{netip.MustParsePrefix("169.254.170.2/32"), "AWS ECS's task metadata address"},
	{netip.MustParsePrefix("100.100.100.200/32"), "Alibaba Cloud's metadata address"},
	{netip.MustParsePrefix("168.63.129.16/32"), "Azure's wireserver"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "AWS's IPv6 metadata address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "a 'this network' address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a CGNAT address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address"},
	{netip.MustParsePrefix("224.0.0.0/3"), "a multicast or reserved address"},
	{netip.MustParsePrefix("::/128"), "the unspecified address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("fc00::/7"), "a private address"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// Forbidden says why ip may not be reached through the proxy ("" when it
// may). An IPv4-mapped IPv6 address is judged as the IPv4 address it maps.
// extra are the deployment's own ranges (its Pod and Service ranges, when
// they are public).
func Forbidden(ip netip.Addr, extra []netip.Prefix) string {
	ip = ip.Unmap()
	for _, f := range forbidden {
		if f.prefix.Contains(ip) {
			return f.why
		}
	}
	for _, p := range extra {
		if p.Contains(ip) {
			return "an address in the cluster's own ranges"
		}
	}
	return ""
}

// Judge checks a name's answers: every one must be public, or none is
// used (a mixed answer is how a rebinding attack hides a private address
// among public ones). It returns the addresses to dial, or why not.
func Judge(answers []netip.Addr, extra []netip.Prefix) ([]netip.Addr, string) {
	if len(answers) == 0 {
		return nil, "the name has no address"
	}
	for _, a := range answers {
		if why := Forbidden(a, extra); why != "" {
			return nil, fmt.Sprintf("the name resolves to %s (%s)", a.Unmap(), why)
		}
	}
	return answers, ""
}

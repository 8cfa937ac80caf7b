package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultPrincipal is the principal of PROVISIONER_API_KEY.
const DefaultPrincipal = "default"

// AnonymousPrincipal is every caller's principal while
// PROVISIONER_AUTH_DISABLED is on: an administrator.
const AnonymousPrincipal = "anonymous"

// Operations are what a principal may be allowed to run, as the doors name
// them (an HTTP route, a CloudEvent type, a POST / operation).
var Operations = []string{"create", "get", "list", "destroy", "pause", "resume", "reap", "templates", "capabilities", "egress"}

// minKeyBytes mirrors auth.MinKeyBytes: a named key shorter than this is
// guessable or a placeholder.
const minKeyBytes = 16

// isKeyName accepts an API key's (or group's) name: a DNS label, as a
// principal's name is written into labels and object names.
func isKeyName(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

// validPrincipal accepts what can be a principal: an API key's name (a DNS
// label) or a service account's username, system:serviceaccount:<ns>:<name>.
func validPrincipal(p string) error {
	if isKeyName(p) || (subjectPattern.MatchString(p) && !strings.HasSuffix(p, ":*")) {
		return nil
	}
	return fmt.Errorf("%q is not a principal: use an API key's name (lowercase letters, digits, '-') or system:serviceaccount:<namespace>:<name>", p)
}

// ParseAPIKeys reads PROVISIONER_API_KEYS ("name=key,name2=key2"; the key is
// everything after the first '=') and adds PROVISIONER_API_KEY as "default"
// when set. Names are principals, so they must be unique, and so must keys
// (one key naming two principals would make the answer depend on order).
// The single key's own problems (unset, short, a template) are auth's to
// report, as before; a named key with such a problem stops start-up.
func ParseAPIKeys(raw, single string) (map[string]string, error) {
	keys := map[string]string{}
	validKey := func(name string) error {
		switch {
		case !isKeyName(name):
			return fmt.Errorf("key name %q must be lowercase letters, digits and '-' (a principal's name)", name)
		case name == DefaultPrincipal:
			// "default" owns the sandboxes that record no principal (made
			// before principals): only PROVISIONER_API_KEY, DeerFlow's key,
			// may be it.
			return fmt.Errorf("key name %q is PROVISIONER_API_KEY's principal; set that variable for it, or choose another name", name)
		case name == AnonymousPrincipal:
			return fmt.Errorf("key name %q is every caller's principal under PROVISIONER_AUTH_DISABLED, an administrator; choose another name", name)
		}
		return nil
	}
	err := parseEntries("PROVISIONER_API_KEYS", raw, ",", "name=key", validKey, func(name, key string) error {
		switch {
		case strings.Contains(key, "{{"):
			return errors.New(`its key holds an unexpanded template (it contains "{{"); set it from a Secret at deploy time`)
		case len(key) < minKeyBytes:
			return fmt.Errorf("its key is shorter than %d bytes", minKeyBytes)
		case key == single:
			return errors.New("it has the same key as PROVISIONER_API_KEY; each principal needs its own")
		}
		for other, k := range keys {
			if k == key {
				return fmt.Errorf("it has the same key as %q; each principal needs its own", other)
			}
		}
		keys[name] = key
		return nil
	})
	if err != nil {
		return nil, err
	}
	if single != "" {
		keys[DefaultPrincipal] = single
	}
	return keys, nil
}

// ParsePrincipalOperations reads PROVISIONER_PRINCIPAL_OPERATIONS:
// "principal=op,op;principal2=op", where a principal is an API key's name, a
// service account's username, or "*" for every principal not listed
// (parseEntries).
func ParsePrincipalOperations(raw string) (map[string][]string, error) {
	out := map[string][]string{}
	validKey := func(p string) error {
		if p == "*" {
			return nil
		}
		return validPrincipal(p)
	}
	err := parseEntries("PROVISIONER_PRINCIPAL_OPERATIONS", raw, ";", "principal=operation[,operation...]", validKey, func(p, list string) error {
		var ops []string
		for _, op := range strings.Split(list, ",") {
			op = strings.TrimSpace(op)
			if !slices.Contains(Operations, op) {
				return fmt.Errorf("%q is not an operation; use %s", op, strings.Join(Operations, ", "))
			}
			if !slices.Contains(ops, op) {
				ops = append(ops, op)
			}
		}
		out[p] = ops
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ParsePrincipalGroups reads PROVISIONER_PRINCIPAL_GROUPS,
// "group=member,member;group2=member" (parseEntries): each member (a key's
// name or a token's username) acts as its group's principal for ownership,
// so the sandboxes one member creates are the others' too. It returns
// member → group.
func ParsePrincipalGroups(raw string) (map[string]string, error) {
	const setting = "PROVISIONER_PRINCIPAL_GROUPS"
	out := map[string]string{}
	groups := map[string]bool{}
	err := parseEntries(setting, raw, ";", "group=member[,member...]", validGroup, func(g, list string) error {
		groups[g] = true
		for _, m := range strings.Split(list, ",") {
			m = strings.TrimSpace(m)
			if err := validPrincipal(m); err != nil {
				return err
			}
			if m == AnonymousPrincipal {
				return fmt.Errorf("%q is every caller's principal under PROVISIONER_AUTH_DISABLED, no credential's", m)
			}
			if prev, dup := out[m]; dup {
				return fmt.Errorf("%q is in groups %q and %q; a member acts as one principal", m, prev, g)
			}
			out[m] = g
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for m := range out {
		if groups[m] && out[m] != m {
			return nil, fmt.Errorf("%s: %q is both a group and a member of group %q", setting, m, out[m])
		}
	}
	return out, nil
}

// validGroup accepts a group's name: a name of its own, shaped as a key's
// name. A service account's username is a token's principal, so a group
// named like one would share that account's sandboxes with its members;
// "anonymous" is every caller under PROVISIONER_AUTH_DISABLED. Whether it
// collides with a key's name is checkPrincipalNames', which sees the keys.
func validGroup(g string) error {
	switch {
	case !isKeyName(g):
		return fmt.Errorf("group name %q must be lowercase letters, digits and '-' (a service account's username is a token's principal, not a group)", g)
	case g == AnonymousPrincipal:
		return fmt.Errorf("group name %q is every caller's principal under PROVISIONER_AUTH_DISABLED; choose another name", g)
	}
	return nil
}

// checkPrincipalNames refuses groups whose name is another principal's:
// every member acts as its group, so a group named like an API key would
// hand that key's sandboxes to the members (and the key's to them) without
// either being listed. The one exception is "default" while
// PROVISIONER_API_KEY is set: naming a group after that key's principal is
// how event-made sandboxes are made the agent backend's own (security.md).
// keys are ParseAPIKeys', groups member -> group (ParsePrincipalGroups).
func checkPrincipalNames(keys map[string]string, groups map[string]string, single string) error {
	var errs []error
	seen := map[string]bool{}
	for _, g := range groups {
		if seen[g] {
			continue
		}
		seen[g] = true
		switch {
		case g == DefaultPrincipal && single == "":
			errs = append(errs, fmt.Errorf("group %q is PROVISIONER_API_KEY's principal, which is unset: set that variable, or choose another name", g))
		case g != DefaultPrincipal && keys[g] != "":
			errs = append(errs, fmt.Errorf("group %q has the name of a key in PROVISIONER_API_KEYS, so that key's sandboxes would be the group's; give the group a name of its own (and list the key as a member to share with it)", g))
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// CreatingPrincipals lists, sorted, the principals that may create
// sandboxes under these settings: each API key's and each allowed token
// subject's (as its group, when it has one), less those that
// PROVISIONER_PRINCIPAL_OPERATIONS keeps from create. Only a create mounts
// data, so only these principals can be tenants of one another's data.
// many is true when a wildcard subject (<ns>:*) may create: any number of
// service accounts, each its own principal. Where its "*" may not create,
// the service accounts of <ns> that the settings name (an operations entry
// or a group member) still count, each as auth judges it. With PROVISIONER_AUTH_DISABLED
// every caller is one administrator. Settings that do not parse count for
// nothing here: Validate reports them.
func (c *AuthConfig) CreatingPrincipals() (principals []string, many bool) {
	if c.AuthDisabled {
		return []string{AnonymousPrincipal}, false
	}
	keys, _ := ParseAPIKeys(c.APIKeys, c.APIKey)
	groups, _ := ParsePrincipalGroups(c.PrincipalGroups)
	ops, _ := ParsePrincipalOperations(c.PrincipalOperations)
	// mayCreate judges a member by its own name, as auth does.
	mayCreate := func(member string) bool {
		list, ok := ops[member]
		if !ok {
			list, ok = ops["*"]
		}
		return !ok || slices.Contains(list, "create")
	}
	set := map[string]bool{}
	add := func(member string) {
		if !mayCreate(member) {
			return
		}
		if g, ok := groups[member]; ok {
			member = g
		}
		set[member] = true
	}
	for name := range keys {
		add(name)
	}
	if c.TokenAudience != "" {
		for _, s := range c.AllowedSubjects {
			ns, wildcard := strings.CutSuffix(s, ":*")
			if !wildcard {
				add(s)
				continue
			}
			many = many || mayCreate("*")
			// The wildcard admits every service account of ns, and auth
			// judges each by its own name: one that
			// PROVISIONER_PRINCIPAL_OPERATIONS or a group names creates
			// even where "*" may not, so it is a tenant too.
			for name := range ops {
				if inNamespace(name, ns) {
					add(name)
				}
			}
			for member := range groups {
				if inNamespace(member, ns) {
					add(member)
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, many
}

// inNamespace reports whether username is a service account of ns
// ("system:serviceaccount:<namespace>", a wildcard subject less its ":*"),
// as auth.SubjectAllowed matches a wildcard.
func inNamespace(username, ns string) bool {
	rest, ok := strings.CutPrefix(username, ns+":")
	return ok && strings.HasPrefix(ns, "system:serviceaccount:") && rest != "" && !strings.Contains(rest, ":")
}

// MultiplePrincipals says whether more than one principal may create
// sandboxes (CreatingPrincipals): then user and thread ids are bound to
// their principals (package ownership), and the settings that would let one
// principal's sandbox reach another's data are refused (Config.Validate).
func (c *AuthConfig) MultiplePrincipals() bool {
	p, many := c.CreatingPrincipals()
	return many || len(p) > 1
}

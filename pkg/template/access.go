package template

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// Who may use a template. A template names its principals
// (keys.TemplatePrincipals); without the annotation every principal may,
// as before. A principal it does not name finds it absent: a create gets
// the 404 of a template that does not exist, the listing leaves it out,
// and a PodTemplate "default" it may not use leaves it the built-in Pod.
// Nothing tells that principal who may.
//
// A template is a tenant boundary only if what it mounts is: a claim or
// an NFS export mounted read-write by a template that several principals
// may use would let each of them read and write the others' files there.
// Such a template is refused at load unless exactly one principal may use
// it (named alone, or the deployment's only one).

// Tenancy is who may create sandboxes, as the template validator needs it:
// to judge a template's names, and how many principals a template without
// names serves. The zero Tenancy is unknown: names are taken as written
// and a template without them counts as serving many principals.
type Tenancy struct {
	known bool
	// creators are the principals that may create: keys' names, allowed
	// subjects', and groups for their members (config.CreatingPrincipals).
	creators []string
	// members maps a group's member to its group: the member acts as it.
	members map[string]string
	// wildcards are the username prefixes (system:serviceaccount:<ns>:)
	// under which every service account may create, each its own principal.
	wildcards []string
}

// TenancyOf is the Tenancy the authentication settings give (which
// config.Validate has checked).
func TenancyOf(c *config.AuthConfig) Tenancy {
	creators, many := c.CreatingPrincipals()
	members, _ := config.ParsePrincipalGroups(c.PrincipalGroups)
	t := Tenancy{known: true, creators: creators, members: members}
	if many {
		for _, s := range c.AllowedSubjects {
			if prefix, ok := strings.CutSuffix(s, "*"); ok {
				t.wildcards = append(t.wildcards, prefix)
			}
		}
	}
	return t
}

// mayCreate reports whether name is a principal that may create sandboxes.
func (t Tenancy) mayCreate(name string) bool {
	if slices.Contains(t.creators, name) {
		return true
	}
	if _, member := t.members[name]; member {
		return false // it acts as its group
	}
	return slices.ContainsFunc(t.wildcards, func(prefix string) bool {
		rest, ok := strings.CutPrefix(name, prefix)
		return ok && rest != "" && !strings.Contains(rest, ":")
	})
}

// single reports whether exactly one principal may use a template that
// names principals (nil: every principal).
func (t Tenancy) single(principals []string) bool {
	if principals != nil {
		return len(principals) == 1
	}
	return t.known && len(t.wildcards) == 0 && len(t.creators) <= 1
}

// Allows reports whether principal may use t.
func (t *Template) Allows(principal string) bool { return allows(t.Principals, principal) }

// allows reports whether principal is among principals (nil: everyone).
func allows(principals []string, principal string) bool {
	return principals == nil || principal != "" && slices.Contains(principals, principal)
}

// principalsOf reads a PodTemplate's principals as written: nil without
// the annotation, else its entries, trimmed, each once. Access follows
// this list even when the template is refused, so that its error is
// listed only to the principals it names.
func principalsOf(pt *corev1.PodTemplate) []string {
	raw, ok := pt.Annotations[keys.TemplatePrincipals]
	if !ok {
		return nil
	}
	out := []string{}
	for _, p := range strings.Split(raw, ",") {
		if p = strings.TrimSpace(p); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// principals checks the names principalsOf read. An error names the
// entry by its place, not its name: the template's error is shown to the
// principals it names, who need not learn one another.
func (v validator) principals(field string, names []string) error {
	for i, p := range names {
		switch {
		case p == "":
			return v.bad(field, "entry %d is empty: want principals' names, comma-separated (an API key's name, a service account's username, or a group)", i+1)
		case v.ten.known && !v.ten.mayCreate(p):
			return v.bad(field, "entry %d names no principal that may create sandboxes: want an API key's name, an allowed service account's username, or a PROVISIONER_PRINCIPAL_GROUPS group (a group's member acts as its group: name the group)", i+1)
		}
	}
	return nil
}

// sharedStorage refuses a claim or NFS export that a container mounts
// read-write when more than one principal may use t (Tenancy.single).
// Read-only, it is data the operator shares with every user of the
// template (datasets, models); read-write, one tenant's sandbox could read
// another's files there, or plant some for it.
func (v validator) sharedStorage(t *Template) error {
	if v.ten.single(t.Principals) {
		return nil
	}
	spec := &t.Pod.Spec
	for i, vol := range spec.Volumes {
		var what string
		switch {
		case vol.PersistentVolumeClaim != nil && !vol.PersistentVolumeClaim.ReadOnly:
			what = fmt.Sprintf("claim %q", vol.PersistentVolumeClaim.ClaimName)
		case vol.NFS != nil && !vol.NFS.ReadOnly:
			what = fmt.Sprintf("NFS export %s:%s", vol.NFS.Server, vol.NFS.Path)
		default:
			continue
		}
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, m := range c.VolumeMounts {
				if m.Name == vol.Name && !m.ReadOnly {
					return v.bad(fmt.Sprintf("template.spec.volumes[%d]", i), "container %q mounts the %s read-write, and more than one principal may use this template, so each could read and write the others' data there; mount it readOnly, or name one principal in %s",
						c.Name, what, keys.TemplatePrincipals)
				}
			}
		}
	}
	return nil
}

package api

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// TestPrincipalOfAndSees pins the legacy rule in its one place: an object
// that records no principal is LegacyPrincipal's, seen by that principal
// and administrators only, and a caller without a principal records
// LegacyPrincipal's.
func TestPrincipalOfAndSees(t *testing.T) {
	objOf := func(annotations map[string]string) metav1.Object {
		return &metav1.ObjectMeta{Annotations: annotations}
	}
	alices := objOf(map[string]string{keys.AnnotationPrincipal: "alice"})
	legacy := objOf(nil)
	empty := objOf(map[string]string{keys.AnnotationPrincipal: ""})
	type row struct {
		PrincipalOf string
		Sees        map[string]bool // caller -> sees
	}
	callers := map[string]Caller{"alice": {Principal: "alice"}, "bob": {Principal: "bob"},
		"legacy": {Principal: LegacyPrincipal}, "admin": {Principal: "ops", Admin: true}, "none": {}}
	got := map[string]row{}
	for name, obj := range map[string]metav1.Object{"alice's": alices, "unrecorded": legacy, "recorded empty": empty} {
		r := row{PrincipalOf: PrincipalOf(obj), Sees: map[string]bool{}}
		for cn, c := range callers {
			r.Sees[cn] = c.Sees(obj)
		}
		got[name] = r
	}
	legacySees := map[string]bool{"alice": false, "bob": false, "legacy": true, "admin": true, "none": false}
	want := map[string]row{
		"alice's":        {PrincipalOf: "alice", Sees: map[string]bool{"alice": true, "bob": false, "legacy": false, "admin": true, "none": false}},
		"unrecorded":     {PrincipalOf: LegacyPrincipal, Sees: legacySees},
		"recorded empty": {PrincipalOf: LegacyPrincipal, Sees: legacySees},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PrincipalOf and Sees (-want +got):\n%s", diff)
	}
	records := map[string]string{}
	for cn, c := range callers {
		records[cn] = c.Records()
	}
	wantRecords := map[string]string{"alice": "alice", "bob": "bob", "legacy": LegacyPrincipal, "admin": "ops", "none": LegacyPrincipal}
	if diff := cmp.Diff(wantRecords, records); diff != "" {
		t.Errorf("Records (-want +got):\n%s", diff)
	}
}

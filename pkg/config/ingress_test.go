package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParsePrincipalIngress(t *testing.T) {
	got, err := ParsePrincipalIngress(" alice=pods:tenant=alice|cidr:203.0.113.0/24 ; system:serviceaccount:team-b:agent=pods:app=agent@kubernetes.io/metadata.name=team-b;")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]IngressSource{
		"alice": {{Pods: &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "alice"}}}, {CIDR: "203.0.113.0/24"}},
		"system:serviceaccount:team-b:agent": {{Pods: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "team-b"}}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParsePrincipalIngress (-want +got):\n%s", diff)
	}
}

// TestParsePrincipalIngressRefusesNamingThePrincipal: every source that does
// not parse, or that could admit sandboxes, stops start-up with the
// principal's name in the message.
func TestParsePrincipalIngressRefusesNamingThePrincipal(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"alice", "must be principal=source"},
		{"alice=", "must be principal=source"},
		{"Alice!=cidr:10.0.0.0/8", "is not a principal"},
		{"alice=cidr:10.0.0.1/8", `principal "alice": source "cidr:10.0.0.1/8" has host bits set`},
		{"alice=cidr:10.0.0.0/33", `principal "alice": source "cidr:10.0.0.0/33": "10.0.0.0/33" is not a CIDR`},
		{"alice=pods:a=(", `principal "alice": source "pods:a=(": the Pod selector`},
		{"alice=pods:app=x@a in (", `principal "alice": source "pods:app=x@a in (": the namespace selector`},
		{"alice=pods:", `principal "alice": source "pods:" selects every Pod of the sandboxes' namespace`},
		{"alice=pods:app=deer-flow-sandbox", `principal "alice": source "pods:app=deer-flow-sandbox" selects sandboxes`},
		{"alice=10.0.0.0/8", `principal "alice": source "10.0.0.0/8" must be cidr:<CIDR> or pods:`},
		{"alice=cidr:10.0.0.0/8;alice=cidr:10.1.0.0/16", `principal "alice" is listed twice`},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			_, err := ParsePrincipalIngress(tc.raw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParsePrincipalIngress(%q) = %v, want an error containing %q", tc.raw, err, tc.want)
			}
		})
	}
}

package sandbox

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/api/apitest"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

// created is the fixed creation time of the tests' specs.
var created = apitest.Created

// testSpec is a valid spec of sandbox 0123456789abcdef, as the operations'
// tests start from (the builders' tests pin the objects it makes).
func testSpec() api.Spec { return apitest.Spec() }

// sharedPolicies are the NetworkPolicies config/ ships for cfg, as objects
// for a fake clientset: without them every create is refused.
func sharedPolicies(cfg *config.Config) []runtime.Object {
	var objs []runtime.Object
	for _, np := range resources.SharedPolicies(cfg.Objects()) {
		objs = append(objs, np)
	}
	return objs
}

// chain says which of a sandbox's Service and workload owns the other, by
// UID: "Pod owns Service" (bound by an update: a ReplicaSet's, a repaired
// or adopted Pod's, every sandbox from before issue 49), "Service owns Pod"
// (a cold create's new Pod, owned from its create), "" for neither.
func chain(svc *corev1.Service, w metav1.Object) string {
	kind := "Pod"
	if _, ok := w.(*appsv1.ReplicaSet); ok {
		kind = "ReplicaSet"
	}
	switch {
	case w.GetUID() != "" && resources.OwnerUID(svc.OwnerReferences) == w.GetUID():
		return kind + " owns Service"
	case resources.OwnedBy(w, svc):
		return "Service owns " + kind
	}
	return ""
}

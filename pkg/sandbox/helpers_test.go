package sandbox

import (
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

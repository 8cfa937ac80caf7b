package isolation

import (
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

// sharedPolicies are the NetworkPolicies config/ ships for cfg, as objects
// for a fake clientset.
func sharedPolicies(cfg *config.Config) []runtime.Object {
	var objs []runtime.Object
	for _, np := range resources.SharedPolicies(cfg.Objects()) {
		objs = append(objs, np)
	}
	return objs
}

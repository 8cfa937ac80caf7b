package sandbox

import (
	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/api/apitest"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
)

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

// created is the fixed creation time of the tests' specs.
var created = apitest.Created

// testSpec is a valid spec of sandbox 0123456789abcdef, as the operations'
// tests start from (the builders' tests pin the objects it makes).
func testSpec() api.Spec { return apitest.Spec() }

package admission

import (
	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/api/apitest"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
)

var testConfig = configtest.Load

// testSpec is a sandbox request as the door validates it.
func testSpec() api.Spec { return apitest.Spec() }

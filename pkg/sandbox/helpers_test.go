package sandbox

import (
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"k8s.io/apimachinery/pkg/api/resource"
)

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

// created is the fixed creation time of the tests' specs.
var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// testSpec is a valid spec of sandbox 0123456789abcdef, as the operations'
// tests start from (the builders' tests pin the objects it makes).
func testSpec() api.Spec {
	return api.Spec{
		ID: "0123456789abcdef", ThreadID: "t1", UserID: "user-1",
		IdleTimeout: time.Hour, MaxLifetime: 24 * time.Hour,
		CPULimit: resource.MustParse("1"), MemoryLimit: resource.MustParse("1Gi"),
		Now: created,
	}
}

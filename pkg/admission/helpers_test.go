package admission

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
)

var testConfig = configtest.Load

// testSpec is a sandbox request as the door validates it.
func testSpec() api.Spec {
	return api.Spec{
		ID: "0123456789abcdef", ThreadID: "t1", UserID: "user-1",
		IdleTimeout: time.Hour, MaxLifetime: 24 * time.Hour,
		CPULimit: resource.MustParse("1"), MemoryLimit: resource.MustParse("1Gi"),
		Now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

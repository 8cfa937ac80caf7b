package resources

import (
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

func TestValidateIDBoundary(t *testing.T) {
	ok := strings.Repeat("a", api.MaxIDLen)
	if err := api.ValidateID(ok); err != nil {
		t.Errorf("api.ValidateID(%d chars) = %v", len(ok), err)
	}
	if got := len(ServiceName(ok)); got != 63 {
		t.Errorf("longest id gives a Service name of %d characters, want 63", got)
	}
	if err := api.ValidateID(ok + "a"); err == nil {
		t.Errorf("ValidateID accepted %d characters", len(ok)+1)
	}
}

package api

import (
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// created is the fixed creation time of the tests' specs.
var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// testConfig is the configuration the environment gives, with env set first.
func testConfig(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	c, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Package configtest gives tests the configuration the environment would:
// config.Load with the variables a test sets, undone when it ends.
package configtest

import (
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// Load sets env for the test (t.Setenv, so parallel tests cannot share it)
// and loads the configuration from the environment.
func Load(t testing.TB, env map[string]string) *config.Config {
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

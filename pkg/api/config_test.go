package api

import (
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
)

// created is the fixed creation time of the tests' specs.
var created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

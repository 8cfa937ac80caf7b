package quota

import "github.com/deerflow-sandbox/provisioner/pkg/config/configtest"

// testConfig is the configuration the environment gives, with env set first.
var testConfig = configtest.Load

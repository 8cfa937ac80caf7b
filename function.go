// Package function is what the Knative func tooling builds: it looks for
// New() in the .go files beside func.yaml. The instance lives in fn/.
package function

import "github.com/deerflow-sandbox/provisioner/fn"

// New returns the provisioner instance.
func New() *fn.Function { return fn.New() }

//go:build tools

// Package serving pins Knative Serving's commands so that go mod tidy keeps
// their dependencies; hack/install-knative.sh builds them by import path in
// one go build.
package serving

import (
	_ "knative.dev/serving/cmd/activator"
	_ "knative.dev/serving/cmd/autoscaler"
	_ "knative.dev/serving/cmd/controller"
	_ "knative.dev/serving/cmd/queue"
	_ "knative.dev/serving/cmd/webhook"
)

//go:build tools

// Package traefik pins Traefik, whose Knative provider is the local Knative
// cluster's KIngress (make knative), so that go mod tidy keeps its
// dependencies.
package traefik

import _ "github.com/traefik/traefik/v3/cmd/traefik"

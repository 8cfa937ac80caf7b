//go:build tools

// Package eventing pins Knative Eventing's commands (core, the
// multi-tenant channel-based Broker, the in-memory channel and the
// PingSource adapter) so that go mod tidy keeps their dependencies;
// hack/install-knative.sh builds them by import path in one go build.
package eventing

import (
	_ "knative.dev/eventing/cmd/broker/filter"
	_ "knative.dev/eventing/cmd/broker/ingress"
	_ "knative.dev/eventing/cmd/controller"
	_ "knative.dev/eventing/cmd/in_memory/channel_controller"
	_ "knative.dev/eventing/cmd/in_memory/channel_dispatcher"
	_ "knative.dev/eventing/cmd/mtchannel_broker"
	_ "knative.dev/eventing/cmd/mtping"
	_ "knative.dev/eventing/cmd/webhook"
)

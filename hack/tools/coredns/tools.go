//go:build tools

// Package coredns pins CoreDNS, the local Knative cluster's DNS, so that go
// mod tidy keeps its dependencies.
package coredns

import _ "github.com/coredns/coredns"

// Command coredns is CoreDNS, built with the plugins that the local Knative
// cluster's Corefile (hack/knative/coredns.yaml) uses and no others. CoreDNS
// registers a plugin by importing it, so a main of our own that imports ten
// plugins is CoreDNS's documented way to build a smaller server. Its stock
// main imports all of them, cloud DNS back ends among them (Route 53, Azure,
// Cloud DNS, etcd, geoip), and a cold build compiled their SDKs for nothing.
//
// A directive this build lacks fails the Corefile's parse with "unknown
// directive", so a plugin added to the Corefile without an import here is
// found when the cluster's DNS starts, not guessed at.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics" // the Corefile's "prometheus"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() { coremain.Run() }

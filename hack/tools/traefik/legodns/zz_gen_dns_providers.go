// Package dns stands in for lego's DNS-01 providers in the local Knative
// cluster's Traefik (hack/install-knative.sh builds Traefik against a copy of
// github.com/go-acme/lego/v4 whose providers/dns is this file).
//
// Traefik there is the KIngress and nothing else: it asks no certificate of
// any ACME server (the machine reaches none), so the DNS-01 challenge is
// never taken. Lego's own file imports some 170 DNS providers and their cloud
// SDKs, about a third of Traefik's source, which a cold build compiled for
// nothing. Every other part of Traefik, its Knative provider included, is
// built from its module unchanged.
package dns

import (
	"fmt"

	"github.com/go-acme/lego/v4/challenge"
)

// NewDNSChallengeProviderByName refuses every provider, naming why, so a
// configuration that asks for one fails at start-up rather than quietly.
func NewDNSChallengeProviderByName(name string) (challenge.Provider, error) {
	return nil, fmt.Errorf("DNS challenge provider %q: this Traefik is built without lego's DNS providers (hack/tools/traefik/legodns)", name)
}

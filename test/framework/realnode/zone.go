package realnode

import (
	"slices"
	"strings"
)

// The public host's names. Its DNS server (PublicResolver, the egress
// proxy's PROXY_RESOLVER in the tests) answers A queries for these from
// PublicZone, AAAA and other queries for them with no records, and every
// other name as the cluster DNS stand-in does (ClusterDNSAnswer). Its TLS
// certificate (PublicTLSAddr) holds all of them. None is a real domain:
// .test is reserved (RFC 2606).
const (
	// AllowedName is the name the egress tests put on an allowlist
	// literally; it resolves to PublicIP.
	AllowedName = "allowed.test"
	// WildPattern is the allowlist's wildcard entry: it matches WildName
	// and not WildApexName.
	WildPattern = "*.wild.test"
	// WildName resolves to PublicIP and is matched by WildPattern.
	WildName = "www.wild.test"
	// WildApexName resolves to PublicIP and is NOT matched by
	// WildPattern: a wildcard covers the names under a domain, not the
	// domain itself.
	WildApexName = "wild.test"
	// UnlistedName resolves to PublicIP and is on no allowlist: a refusal
	// of it is the allowlist's doing, not the network policy's.
	UnlistedName = "unlisted.test"
	// GrantedName resolves to PublicIP and is kept off the base allowlist,
	// for a test that grants it on its own (to one sandbox, principal or
	// request) and shows the grant reaches only what it was given to.
	GrantedName = "granted.test"
	// RebindName resolves to an off-node private host that exists and
	// answers (OffNodeHosts[0], 10.250.0.10): an allowed-looking name
	// that leads into a private range, which the proxy must refuse after
	// it resolves the name (DNS rebinding).
	RebindName = "rebind.test"
	// MixedName resolves to PublicIP and to the same private host as
	// RebindName: the proxy must not reach the private address, whichever
	// the resolver lists first.
	MixedName = "mixed.test"

	// PublicResolver is the public host's DNS server (UDP).
	PublicResolver = PublicIP + ":53"
	// PublicTLSAddr is where the public host serves the stand-in's API
	// over TLS, with a self-signed certificate made when it starts for
	// the names of PublicZone and PublicIP. GET /v1/cert (on port 80 or
	// 443) answers that certificate's SHA-256 fingerprint in hex.
	PublicTLSAddr = PublicIP + ":443"
)

// PublicZone is the public host's DNS zone: each name with the addresses
// its A query answers (a fresh map: changing it changes nothing).
func PublicZone() map[string][]string {
	private := OffNodeHosts[0].IP
	return map[string][]string{
		AllowedName:  {PublicIP},
		WildName:     {PublicIP},
		WildApexName: {PublicIP},
		UnlistedName: {PublicIP},
		GrantedName:  {PublicIP},
		RebindName:   {private},
		MixedName:    {PublicIP, private},
	}
}

// ZoneEnv renders a zone as the stand-in's SANDBOX_DNS_ZONE
// ("name=ip[,ip];name=ip..."), names in order so that the value is the
// same every run.
func ZoneEnv(zone map[string][]string) string {
	names := zoneNames(zone)
	entries := make([]string, 0, len(names))
	for _, n := range names {
		entries = append(entries, n+"="+strings.Join(zone[n], ","))
	}
	return strings.Join(entries, ";")
}

// PublicZoneEnv is PublicZone as SANDBOX_DNS_ZONE.
func PublicZoneEnv() string { return ZoneEnv(PublicZone()) }

// PublicTLSNames are the names in the public host's certificate, as the
// stand-in's SANDBOX_TLS_NAMES lists them (comma-separated).
func PublicTLSNames() []string { return zoneNames(PublicZone()) }

func zoneNames(zone map[string][]string) []string {
	names := make([]string, 0, len(zone))
	for n := range zone {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// publicHostEnv is what the public host's stand-in runs with besides its
// HTTP and DNS addresses: its zone and its TLS server.
func publicHostEnv() []string {
	return []string{
		"SANDBOX_DNS_ZONE=" + PublicZoneEnv(),
		"SANDBOX_TLS_ADDR=" + PublicTLSAddr,
		"SANDBOX_TLS_NAMES=" + strings.Join(PublicTLSNames(), ","),
	}
}

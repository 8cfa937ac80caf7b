package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"net/netip"
	"strings"
)

// fallbackAnswer is the one address every A query outside the zone gets:
// the cluster DNS stand-in answers every name so, and tests of a sandbox's
// DNS look for it (realnode.ClusterDNSAnswer).
var fallbackAnswer = netip.MustParseAddr("192.0.2.53")

// dnsZone is what SANDBOX_DNS_ZONE names: each name (lower case, no
// trailing dot) with the IPv4 addresses its A query answers. Names in it
// are all a host outside the cluster knows, so other types of query for
// them answer no records; every name outside it answers as before the zone
// existed (fallbackAnswer).
type dnsZone map[string][]netip.Addr

// parseZone reads SANDBOX_DNS_ZONE: "name=ip[,ip];name=ip...". A name
// given twice, an entry without "=" or an address that is not IPv4 is an
// error: a zone that silently drops a record would make a test see the
// fallback answer and blame the code under test.
func parseZone(s string) (dnsZone, error) {
	zone := dnsZone{}
	for _, entry := range strings.Split(s, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, ips, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, fmt.Errorf("zone entry %q: want name=ip[,ip]", entry)
		}
		name = canonicalName(name)
		if name == "" {
			return nil, fmt.Errorf("zone entry %q: no name", entry)
		}
		if _, dup := zone[name]; dup {
			return nil, fmt.Errorf("zone entry %q: %s is given twice", entry, name)
		}
		var addrs []netip.Addr
		for _, ip := range strings.Split(ips, ",") {
			a, err := netip.ParseAddr(strings.TrimSpace(ip))
			if err != nil {
				return nil, fmt.Errorf("zone entry %q: %w", entry, err)
			}
			if !a.Is4() {
				return nil, fmt.Errorf("zone entry %q: %s is not IPv4 (the zone answers A queries only)", entry, a)
			}
			addrs = append(addrs, a)
		}
		zone[name] = addrs
	}
	return zone, nil
}

// canonicalName is a name as the zone keys it: DNS names are compared
// without regard to case, and a query's name is absolute.
func canonicalName(name string) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
}

// answer is what the zone answers for a query of qtype for name: nil
// (no records, yet no error) for all but A queries.
func (z dnsZone) answer(name string, qtype uint16) []netip.Addr {
	const typeA = 1
	if qtype != typeA {
		return nil
	}
	if addrs, ok := z[canonicalName(name)]; ok {
		return addrs
	}
	return []netip.Addr{fallbackAnswer}
}

// serveDNS answers queries on addr (UDP) from zone (nil: every A query
// gets fallbackAnswer).
func serveDNS(addr string, zone dnsZone) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		log.Fatal(err)
	}
	serveDNSOn(pc, zone)
}

// serveDNSOn answers every query that comes to pc until pc is closed.
func serveDNSOn(pc net.PacketConn, zone dnsZone) {
	buf := make([]byte, 512)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if resp := answerDNS(buf[:n], zone); resp != nil {
			_, _ = pc.WriteTo(resp, from)
		}
	}
}

// answerDNS builds the response to one query: just enough of RFC 1035 for
// a resolver (Go's, or a proxy's) to accept it. It returns nil for what is
// no query it can read; a resolver then times out, as against a server
// that drops junk.
func answerDNS(query []byte, zone dnsZone) []byte {
	if len(query) < 12 {
		return nil
	}
	// The question: labels up to the root, then type and class. A query
	// has no earlier name to point to, so no compression to follow.
	var labels []string
	i := 12
	for {
		if i >= len(query) {
			return nil
		}
		l := int(query[i])
		if l == 0 {
			i++
			break
		}
		if l&0xc0 != 0 || i+1+l > len(query) {
			return nil
		}
		labels = append(labels, string(query[i+1:i+1+l]))
		i += 1 + l
	}
	if i+4 > len(query) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(query[i:])
	question := query[12 : i+4] // name, type, class, echoed as asked
	addrs := zone.answer(strings.Join(labels, "."), qtype)

	resp := append([]byte{}, query[:2]...)        // id
	resp = append(resp, 0x81, 0x80)               // a response; recursion desired and available; no error
	resp = binary.BigEndian.AppendUint16(resp, 1) // one question
	resp = binary.BigEndian.AppendUint16(resp, uint16(len(addrs)))
	resp = append(resp, 0, 0, 0, 0) // no authority, no additional records
	resp = append(resp, question...)
	for _, a := range addrs {
		ip := a.As4()
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4) // pointer to the question's name, A, IN, TTL 60, 4 bytes
		resp = append(resp, ip[:]...)
	}
	return resp
}

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

func TestParseZone(t *testing.T) {
	addr := netip.MustParseAddr
	for _, tc := range []struct {
		in      string
		want    dnsZone
		wantErr string
	}{
		{in: "", want: dnsZone{}},
		{in: "allowed.test=203.0.113.10", want: dnsZone{"allowed.test": {addr("203.0.113.10")}}},
		{
			in: " Mixed.Test.=203.0.113.10, 10.250.0.10 ; rebind.test=10.250.0.10;",
			want: dnsZone{
				"mixed.test":  {addr("203.0.113.10"), addr("10.250.0.10")},
				"rebind.test": {addr("10.250.0.10")},
			},
		},
		{in: "allowed.test", wantErr: "want name=ip"},
		{in: "=203.0.113.10", wantErr: "no name"},
		{in: "a.test=203.0.113.10;A.test=203.0.113.11", wantErr: "given twice"},
		{in: "a.test=2001:db8::1", wantErr: "not IPv4"},
		{in: "a.test=203.0.113", wantErr: "too short"},
		{in: "a.test=", wantErr: "unable to parse IP"},
	} {
		got, err := parseZone(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseZone(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseZone(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("parseZone(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

// startDNS serves zone on a loopback UDP port and returns a resolver that
// asks only it, as the dns action's does.
func startDNS(t *testing.T, zone dnsZone) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { serveDNSOn(pc, zone); close(done) }()
	t.Cleanup(func() { pc.Close(); <-done })
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

// TestDNSZoneThroughGoResolver asks a real Go resolver, which checks the
// answers as a proxy's resolver would (id, question, record layout).
func TestDNSZoneThroughGoResolver(t *testing.T) {
	zone, err := parseZone("allowed.test=203.0.113.10;mixed.test=203.0.113.10,10.250.0.10;rebind.test=10.250.0.10")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		zone    dnsZone
		network string // LookupIP's: ip4 asks A, ip6 AAAA, ip both
		name    string
		want    []string // nil: no such host
	}{
		{zone, "ip", "allowed.test", []string{"203.0.113.10"}},
		{zone, "ip", "ALLOWED.test.", []string{"203.0.113.10"}},
		{zone, "ip4", "mixed.test", []string{"10.250.0.10", "203.0.113.10"}},
		{zone, "ip", "rebind.test", []string{"10.250.0.10"}},
		// A zone name has no AAAA: no records, not the fallback.
		{zone, "ip6", "allowed.test", nil},
		// Outside the zone, and without one: the cluster DNS stand-in's
		// answer, as before zones.
		{zone, "ip", "elsewhere.example", []string{"192.0.2.53"}},
		{nil, "ip", "allowed.test", []string{"192.0.2.53"}},
		{nil, "ip6", "allowed.test", nil},
	} {
		res := startDNS(t, tc.zone)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ips, err := res.LookupIP(ctx, tc.network, tc.name)
		cancel()
		if tc.want == nil {
			var dnsErr *net.DNSError
			if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
				t.Errorf("zone %v: LookupIP(%s, %s) = %v, %v; want no such host", tc.zone, tc.network, tc.name, ips, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("zone %v: LookupIP(%s, %s): %v", tc.zone, tc.network, tc.name, err)
			continue
		}
		var got []string
		for _, ip := range ips {
			got = append(got, ip.String())
		}
		slices.Sort(got)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("zone %v: LookupIP(%s, %s) (-want +got):\n%s", tc.zone, tc.network, tc.name, diff)
		}
	}
}

// TestAnswerDNSOtherTypes covers what a Go resolver never asks: a TXT
// query for a zone name answers no records and no error; junk gets no
// answer at all.
func TestAnswerDNSOtherTypes(t *testing.T) {
	zone := dnsZone{"allowed.test": {netip.MustParseAddr("203.0.113.10")}}
	query := []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	query = append(query, 7, 'a', 'l', 'l', 'o', 'w', 'e', 'd', 4, 't', 'e', 's', 't', 0, 0, 16, 0, 1) // TXT, IN
	resp := answerDNS(query, zone)
	if len(resp) != len(query) {
		t.Fatalf("TXT answer: %d bytes, want %d (the question alone): %x", len(resp), len(query), resp)
	}
	if id, rcode, an := binary.BigEndian.Uint16(resp), resp[3]&0x0f, binary.BigEndian.Uint16(resp[6:]); id != 0xabcd || rcode != 0 || an != 0 {
		t.Errorf("TXT answer: id %#x rcode %d answers %d; want 0xabcd, 0, 0", id, rcode, an)
	}
	for _, junk := range [][]byte{nil, query[:11], query[:len(query)-1], append(query[:12:12], 0xc0, 12, 0, 1, 0, 1)} {
		if resp := answerDNS(junk, zone); resp != nil {
			t.Errorf("answerDNS(%x) = %x; want no answer", junk, resp)
		}
	}
}

// TestPublicHostsZone: the stand-in takes the zone the real node gives
// the public host, and answers each of its names as realnode says.
func TestPublicHostsZone(t *testing.T) {
	zone, err := parseZone(realnode.PublicZoneEnv())
	if err != nil {
		t.Fatal(err)
	}
	res := startDNS(t, zone)
	for name, want := range realnode.PublicZone() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := res.LookupHost(ctx, name)
		cancel()
		if err != nil {
			t.Errorf("LookupHost(%s): %v", name, err)
			continue
		}
		want = slices.Clone(want)
		slices.Sort(want)
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("LookupHost(%s) (-want +got):\n%s", name, diff)
		}
	}
}

package main

import (
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSelfSigned(t *testing.T) {
	cert, err := selfSigned([]string{"allowed.test", "www.wild.test"}, "203.0.113.10")
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if diff := cmp.Diff([]string{"allowed.test", "www.wild.test"}, leaf.DNSNames); diff != "" {
		t.Errorf("DNS SANs (-want +got):\n%s", diff)
	}
	if len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "203.0.113.10" {
		t.Errorf("IP SANs %v, want [203.0.113.10]", leaf.IPAddresses)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", leaf.PublicKey)
	}
	for _, name := range []string{"allowed.test", "www.wild.test", "203.0.113.10"} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("VerifyHostname(%s): %v", name, err)
		}
	}
	sum := sha256.Sum256(cert.Certificate[0])
	if got, want := certFingerprint(cert.Certificate[0]), hex.EncodeToString(sum[:]); got != want {
		t.Errorf("certFingerprint = %s, want %s", got, want)
	}
	if _, err := selfSigned(nil, "not-an-ip"); err == nil {
		t.Error("selfSigned with IP not-an-ip: no error")
	}
}

// TestECHConfigAcceptedByGo shows the ECHConfigList is a real one: a Go
// client sends ECH with it, and a Go server holding the private key
// decrypts the inner ClientHello (the inner name arrives, though only the
// public name was in the clear).
func TestECHConfigAcceptedByGo(t *testing.T) {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	config, list, err := echConfig(7, key.PublicKey(), "public.test")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := selfSigned([]string{"public.test", "secret.test"}, "")
	if err != nil {
		t.Fatal(err)
	}
	cc, sc := net.Pipe()
	defer cc.Close()
	defer sc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server := tls.Server(sc, &tls.Config{
		Certificates:             []tls.Certificate{cert},
		EncryptedClientHelloKeys: []tls.EncryptedClientHelloKey{{Config: config, PrivateKey: key.Bytes(), SendAsRetry: true}},
	})
	serverDone := make(chan error, 1)
	go func() { serverDone <- server.HandshakeContext(ctx) }()
	client := tls.Client(cc, &tls.Config{
		ServerName:                     "secret.test",
		InsecureSkipVerify:             true,
		MinVersion:                     tls.VersionTLS13,
		EncryptedClientHelloConfigList: list,
	})
	if err := client.HandshakeContext(ctx); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := <-serverDone; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	if cs := client.ConnectionState(); !cs.ECHAccepted {
		t.Error("client: ECH not accepted")
	}
	if cs := server.ConnectionState(); !cs.ECHAccepted || cs.ServerName != "secret.test" {
		t.Errorf("server: ECH accepted %v, server name %q; want true, secret.test", cs.ECHAccepted, cs.ServerName)
	}
}

func TestECHConfigRefusesWhatItCannotBuild(t *testing.T) {
	x, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		key  *ecdh.PublicKey
		name string
	}{
		{"a P-256 key", p.PublicKey(), "public.test"},
		{"no public name", x.PublicKey(), ""},
		{"a public name over 255 bytes", x.PublicKey(), string(make([]byte, 256))},
	} {
		if _, _, err := echConfig(1, tc.key, tc.name); err == nil {
			t.Errorf("%s: no error", tc.what)
		}
	}
}

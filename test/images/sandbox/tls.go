package main

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"time"
)

// selfSigned makes the certificate the stand-in serves TLS with: a fresh
// ECDSA P-256 key, valid for names and ip (when not empty). Nobody trusts
// it; tests compare its fingerprint (certFingerprint, GET /v1/cert) with
// what a client saw, which shows that nothing between them (the egress
// proxy) answered the handshake with a certificate of its own.
func selfSigned(names []string, ip string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generate the TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("draw a serial number: %w", err)
	}
	cn := "sandbox stand-in"
	if len(names) > 0 {
		cn = names[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     names,
		// An hour back: a clock a little behind the server's still
		// accepts it.
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip != "" {
		parsed := net.ParseIP(ip)
		if parsed == nil {
			return tls.Certificate{}, fmt.Errorf("certificate IP %q is no IP address", ip)
		}
		tmpl.IPAddresses = []net.IP{parsed}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("create the certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parse the certificate just made: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// certFingerprint is the SHA-256 of a certificate's DER, in hex: what
// GET /v1/cert answers and what the http and tunnel actions report as
// cert=.
func certFingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// peerFingerprint is the fingerprint of the leaf certificate a TLS peer
// presented, "" when it presented none.
func peerFingerprint(cs *tls.ConnectionState) string {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return ""
	}
	return certFingerprint(cs.PeerCertificates[0].Raw)
}

// tlsNames splits SANDBOX_TLS_NAMES (comma-separated).
func tlsNames(s string) []string {
	var names []string
	for _, n := range strings.Split(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// ECH (draft-ietf-tls-esni, as Go's crypto/tls implements it).
const (
	echVersion    = 0xfe0d // ECHConfig.version
	hpkeX25519    = 0x0020 // DHKEM(X25519, HKDF-SHA256)
	hpkeHKDF256   = 0x0001 // HKDF-SHA256
	hpkeAES128GCM = 0x0001 // AES-128-GCM
	// echMaxNameLength is the longest inner name the config promises:
	// clients pad the inner ClientHello's name to it.
	echMaxNameLength = 64
)

// echConfig builds an ECHConfig for an X25519 public key and the
// ECHConfigList that holds only it: the list is what a client is
// configured with (tls.Config.EncryptedClientHelloConfigList), the config
// what a server keeps beside the private key
// (tls.EncryptedClientHelloKey.Config). With it a sandbox sends a real ECH
// extension, whose inner ClientHello nobody but that key's holder can
// read — what an egress proxy that decides by the SNI it sees must refuse.
//
// Built by hand rather than with golang.org/x/crypto/cryptobyte, which
// would make x/crypto a direct requirement of the module for a test image:
// the format is a few length-prefixed fields.
func echConfig(id uint8, pub *ecdh.PublicKey, publicName string) (config, list []byte, err error) {
	if pub.Curve() != ecdh.X25519() {
		return nil, nil, errors.New("ECH config: the key is not X25519")
	}
	if publicName == "" || len(publicName) > 255 {
		return nil, nil, fmt.Errorf("ECH config: public name %q must be 1 to 255 bytes", publicName)
	}
	var c []byte // ECHConfigContents
	c = append(c, id)
	c = binary.BigEndian.AppendUint16(c, hpkeX25519)
	c = appendUint16Prefixed(c, pub.Bytes())
	c = appendUint16Prefixed(c, binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, hpkeHKDF256), hpkeAES128GCM))
	c = append(c, echMaxNameLength)
	c = append(c, byte(len(publicName)))
	c = append(c, publicName...)
	c = appendUint16Prefixed(c, nil) // no extensions

	config = binary.BigEndian.AppendUint16(nil, echVersion)
	config = appendUint16Prefixed(config, c)
	return config, appendUint16Prefixed(nil, config), nil
}

// appendUint16Prefixed appends b after its length as two bytes.
func appendUint16Prefixed(dst, b []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(b)))
	return append(dst, b...)
}

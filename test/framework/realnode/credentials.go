package realnode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// writeCredentials issues client certificates signed by the cluster's CA:
// the kubelet's passes the Node authorizer (O=system:nodes), kube-proxy's is
// the system:kube-proxy user.
func (n *Node) writeCredentials() error {
	caPEM, err := os.ReadFile(filepath.Join(n.cluster.PKIDir, "ca.crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(n.cluster.PKIDir, "ca.key"))
	if err != nil {
		return err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return errors.New("the cluster's CA is not PEM")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	var caKey any
	if caKey, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
		if caKey, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
			return fmt.Errorf("the cluster's CA key: %w", err)
		}
	}
	if _, ok := caKey.(*rsa.PrivateKey); !ok {
		if _, ok := caKey.(*ecdsa.PrivateKey); !ok {
			return fmt.Errorf("the cluster's CA key is a %T", caKey)
		}
	}
	for _, id := range []struct{ file, cn, org string }{
		{"kubelet", "system:node:" + Name, "system:nodes"},
		{"kube-proxy", "system:kube-proxy", ""},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		subject := pkix.Name{CommonName: id.cn}
		if id.org != "" {
			subject.Organization = []string{id.org}
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: subject,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		crt, k := filepath.Join(n.State, id.file+".crt"), filepath.Join(n.State, id.file+".key")
		if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
			return err
		}
		kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, n.cluster.Host, filepath.Join(n.cluster.PKIDir, "ca.crt"), id.file, crt, k, id.file)
		if err := os.WriteFile(filepath.Join(n.State, id.file+".kubeconfig"), []byte(kubeconfig), 0o600); err != nil {
			return err
		}
	}
	return nil
}

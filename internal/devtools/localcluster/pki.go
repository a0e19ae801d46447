package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certAuthority signs the certificates that kubelets and the API server show
// each other: the API server trusts it for client certificates (a kubelet
// authenticates as system:node:<name>), and kubelets trust it both for the API
// server's client certificate and as the issuer of their serving certificate.
// Written with crypto/x509 because it is a few calls; no PKI library earns its
// weight for one local CA.
type certAuthority struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

const certValidity = 365 * 24 * time.Hour

// newCertAuthority makes a fresh self-signed CA and writes ca.crt and ca.key
// into dir.
func newCertAuthority(dir string) (*certAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serialNumber(),
		Subject:               pkix.Name{CommonName: "strata-local-ca"},
		NotBefore:             time.Now().Add(-time.Hour), // tolerate small clock differences
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &certAuthority{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	if err := writeCertPair(filepath.Join(dir, "ca"), ca.CertPEM, key); err != nil {
		return nil, err
	}
	return ca, nil
}

// certRequest describes one leaf certificate.
type certRequest struct {
	CommonName string
	Groups     []string // the Organization field: Kubernetes groups
	IPs        []net.IP // server certificates only
	Server     bool     // serving (else client) certificate
}

// issue signs a leaf certificate and writes <base>.crt and <base>.key.
func (ca *certAuthority) issue(base string, req certRequest) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	usage := x509.ExtKeyUsageClientAuth
	if req.Server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: serialNumber(),
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Groups},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  req.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate for %s: %w", req.CommonName, err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writeCertPair(base, certPEM, key); err != nil {
		return nil, nil, err
	}
	keyPEM, err = os.ReadFile(base + ".key")
	return certPEM, keyPEM, err
}

func writeCertPair(base string, certPEM []byte, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".crt", certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(base+".key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func serialNumber() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

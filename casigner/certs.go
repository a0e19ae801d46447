package casigner

// The SnapshotMetadata sidecar's serving certificate, issued from Strata's
// CA and re-issued when the CA changes or it nears expiry.

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"time"

	"github.com/strata-storage/strata/internal/pki"
)

// servingValidity bounds a serving certificate's life (never past its CA's).
const servingValidity = 90 * 24 * time.Hour

// servingCert is the snapshot metadata sidecar's serving certificate.
type servingCert struct {
	cert    *tls.Certificate
	issuer  *x509.Certificate
	renewAt time.Time
}

// issueServing signs a serving certificate named commonName for hosts (IP
// addresses and DNS names) with ca. It is renewed two thirds into its life.
func issueServing(ca *pki.KeyPair, commonName string, hosts []string, now time.Time) (*servingCert, error) {
	key, err := pki.NewKey()
	if err != nil {
		return nil, err
	}
	serial, err := pki.NewSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(servingValidity)
	if ca.Cert.NotAfter.Before(notAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-pki.ClockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return newServingCert(&tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, ca.Cert), nil
}

// newServingCert is cert, signed by issuer, due two thirds into its life.
func newServingCert(cert *tls.Certificate, issuer *x509.Certificate) *servingCert {
	life := cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore.Add(pki.ClockSkew))
	return &servingCert{cert: cert, issuer: issuer, renewAt: cert.Leaf.NotBefore.Add(pki.ClockSkew + life*2/3)}
}

// due reports whether c must be replaced at now: signed by a CA that no
// longer signs, two thirds into its life, or not valid for every one of hosts.
func (c *servingCert) due(state *pki.CAState, hosts []string, now time.Time) bool {
	if !c.issuer.Equal(state.Current.Cert) || !now.Before(c.renewAt) {
		return true
	}
	return !pki.IssuedFor(c.cert.Leaf, hosts)
}

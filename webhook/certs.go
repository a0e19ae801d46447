package webhook

// The webhook's serving certificate: one per manager, issued from Strata's
// CA (internal/pki) and re-issued when the CA changes or it nears expiry.

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/strata-storage/strata/internal/pki"
)

const (
	// CAValidity is how long a CA is valid; the leader replaces it
	// --webhook-ca-rotate-before its expiry.
	CAValidity = pki.CAValidity
	// CASecretName holds the CA.
	CASecretName = pki.CASecretName
	// servingValidity bounds a serving certificate's life (never past its CA's).
	servingValidity = 90 * 24 * time.Hour
	// promoteAfter is how long a new CA sits in the applied configurations'
	// bundle before it signs certificates, so that the API server and every
	// manager and instance manager trust it by then.
	promoteAfter = 30 * time.Second
	// retireAfter is how long the replaced CA stays trusted after the new
	// one was promoted: every node's keeper re-issues its identities on
	// the Secret's change (seconds), and the webhook serving certificates
	// follow; after it a certificate of the old CA is refused everywhere,
	// which is what rotating after a key theft is for.
	retireAfter = time.Minute
)

// servingCert is one manager's serving certificate.
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

// servingHosts are the names a manager's serving certificate is valid for:
// loopback, the listen and URL hosts (local mode), and the Service's DNS
// names (package mode).
func servingHosts(namespace string, extra ...string) []string {
	hosts := []string{"127.0.0.1", "localhost",
		ServiceName + "." + namespace + ".svc", ServiceName + "." + namespace + ".svc.cluster.local"}
	for _, h := range extra {
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) || slices.Contains(hosts, h) {
			continue
		}
		hosts = append(hosts, h)
	}
	return hosts
}

// ServingCerts holds this manager's serving certificate and re-issues it when
// the CA changes or it nears expiry. TLS handshakes read it through
// GetCertificate, so a new certificate is served without a restart.
type ServingCerts struct {
	hosts []string
	clock clock.PassiveClock
	cur   atomic.Pointer[servingCert]
}

// NewServingCerts is empty until the first Refresh.
func NewServingCerts(hosts []string, clk clock.PassiveClock) *ServingCerts {
	return &ServingCerts{hosts: hosts, clock: clk}
}

// GetCertificate is tls.Config.GetCertificate.
func (s *ServingCerts) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.cur.Load()
	if c == nil {
		return nil, errors.New("no serving certificate yet")
	}
	return c.cert, nil
}

// Refresh issues a new serving certificate from the state's current CA if
// there is none yet, it was signed by another CA, or it is due for renewal.
func (s *ServingCerts) Refresh(state *pki.CAState) (bool, error) {
	now := s.clock.Now()
	if c := s.cur.Load(); c != nil && !c.due(state, nil, now) {
		return false, nil
	}
	c, err := issueServing(state.Current, ServiceName, s.hosts, now)
	if err != nil {
		return false, fmt.Errorf("issuing the webhook serving certificate: %w", err)
	}
	s.cur.Store(c)
	return true, nil
}

// RenewAt is when the current certificate is due; zero if there is none.
func (s *ServingCerts) RenewAt() time.Time {
	if c := s.cur.Load(); c != nil {
		return c.renewAt
	}
	return time.Time{}
}

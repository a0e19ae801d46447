package webhook

// The webhook's certificates: a self-signed CA kept in the Secret
// strata-webhook-ca (shared by every manager), and one serving certificate
// per manager issued from it.
//
// They are made with crypto/x509 directly: client-go's cert helpers read the
// wall clock (rotation could not be tested with an injected clock) and cannot
// sign a serving certificate with a CA they are given.

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

const (
	// CAValidity is how long a webhook CA is valid; the leader replaces it
	// --webhook-ca-rotate-before its expiry.
	CAValidity = 365 * 24 * time.Hour
	// servingValidity bounds a serving certificate's life (never past its CA's).
	servingValidity = 90 * 24 * time.Hour
	// clockSkew backdates NotBefore so that a peer whose clock runs a little
	// behind still accepts a fresh certificate.
	clockSkew = 5 * time.Minute
	// promoteAfter is how long a new CA sits in the applied configurations'
	// bundle before it signs serving certificates, so that the API server
	// trusts it by then.
	promoteAfter = 30 * time.Second
)

// Keys of the CA Secret.
const (
	keyCACert   = "ca.crt"
	keyCAKey    = "ca.key"
	keyNextCert = "next-ca.crt"
	keyNextKey  = "next-ca.key"
	// keyBundle holds every CA certificate clients must trust: the current
	// one, the next one during a rotation, and replaced ones until they expire.
	keyBundle = "ca-bundle.crt"
)

// keyPair is a certificate and its private key.
type keyPair struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// newCA makes a self-signed CA valid for CAValidity from now.
func newCA(now time.Time) (*keyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("strata-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &keyPair{cert: cert, key: key}, nil
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func (kp *keyPair) keyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(kp.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parseKeyPair(certData, keyData []byte) (*keyPair, error) {
	certs, err := parseCerts(certData)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("want one certificate, found %d", len(certs))
	}
	block, _ := pem.Decode(keyData)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	if !key.PublicKey.Equal(certs[0].PublicKey) {
		return nil, errors.New("the private key does not match the certificate")
	}
	return &keyPair{cert: certs[0], key: key}, nil
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return certs, nil
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
}

// caState is the content of the CA Secret.
type caState struct {
	current *keyPair
	next    *keyPair // only during a rotation
	bundle  []*x509.Certificate
}

func newCAState(now time.Time) (*caState, error) {
	ca, err := newCA(now)
	if err != nil {
		return nil, err
	}
	return &caState{current: ca, bundle: []*x509.Certificate{ca.cert}}, nil
}

func parseCAState(data map[string][]byte) (*caState, error) {
	current, err := parseKeyPair(data[keyCACert], data[keyCAKey])
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", keyCACert, keyCAKey, err)
	}
	s := &caState{current: current}
	if len(data[keyNextCert]) > 0 {
		if s.next, err = parseKeyPair(data[keyNextCert], data[keyNextKey]); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", keyNextCert, keyNextKey, err)
		}
	}
	if s.bundle, err = parseCerts(data[keyBundle]); err != nil {
		return nil, fmt.Errorf("%s: %w", keyBundle, err)
	}
	// The bundle must hold the CAs in use, whatever was written.
	for _, kp := range []*keyPair{s.current, s.next} {
		if kp != nil && !s.trusts(kp.cert) {
			s.bundle = append(s.bundle, kp.cert)
		}
	}
	return s, nil
}

func (s *caState) trusts(c *x509.Certificate) bool {
	return slices.ContainsFunc(s.bundle, func(b *x509.Certificate) bool { return b.Equal(c) })
}

func (s *caState) secretData() (map[string][]byte, error) {
	key, err := s.current.keyPEM()
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{keyCACert: certPEM(s.current.cert), keyCAKey: key, keyBundle: s.bundlePEM()}
	if s.next != nil {
		if data[keyNextKey], err = s.next.keyPEM(); err != nil {
			return nil, err
		}
		data[keyNextCert] = certPEM(s.next.cert)
	}
	return data, nil
}

// bundlePEM is the caBundle of the webhook configurations.
func (s *caState) bundlePEM() []byte {
	var b bytes.Buffer
	for _, c := range s.bundle {
		b.Write(certPEM(c))
	}
	return b.Bytes()
}

// rotate is the leader's periodic step, in two phases so that no manager is
// ever cut off:
//
//  1. within rotateBefore of the current CA's expiry, a next CA is made and
//     added to the bundle; the leader then writes the bundle into the webhook
//     configurations, while serving certificates still come from the current CA;
//  2. promote (below) makes the next CA current once the bundle has been
//     applied, and managers re-issue their serving certificates from it.
//
// The replaced CA stays in the bundle until it expires, since managers that
// have not re-issued yet still present certificates it signed. A CA that has
// already expired (a cluster switched off for a year) is replaced at once:
// nothing it signed is valid any more. rotate reports whether s changed.
func (s *caState) rotate(now time.Time, rotateBefore time.Duration) (bool, error) {
	changed := false
	switch {
	case !now.Before(s.current.cert.NotAfter):
		if s.next == nil || !now.Before(s.next.cert.NotAfter) {
			ca, err := newCA(now)
			if err != nil {
				return false, err
			}
			s.next = ca
		}
		s.current, s.next, changed = s.next, nil, true
	case s.next == nil && !now.Before(s.current.cert.NotAfter.Add(-rotateBefore)):
		ca, err := newCA(now)
		if err != nil {
			return false, err
		}
		s.next, changed = ca, true
	}
	// Keep the bundle: CAs in use, and older ones until they expire.
	bundle := s.bundle[:0:0]
	for _, c := range s.bundle {
		if now.Before(c.NotAfter) || c.Equal(s.current.cert) {
			bundle = append(bundle, c)
		}
	}
	for _, kp := range []*keyPair{s.current, s.next} {
		if kp != nil && !slices.ContainsFunc(bundle, func(b *x509.Certificate) bool { return b.Equal(kp.cert) }) {
			bundle = append(bundle, kp.cert)
		}
	}
	if len(bundle) != len(s.bundle) {
		changed = true
	}
	s.bundle = bundle
	return changed, nil
}

// promote makes the next CA current. The caller has had the bundle, which
// holds the next CA, in the configurations for promoteAfter.
func (s *caState) promote() {
	if s.next != nil {
		s.current, s.next = s.next, nil
	}
}

// servingCert is one manager's serving certificate.
type servingCert struct {
	cert    *tls.Certificate
	issuer  *x509.Certificate
	renewAt time.Time
}

// issueServing signs a serving certificate for hosts (IP addresses and DNS
// names) with ca. It is renewed two thirds into its life.
func issueServing(ca *keyPair, hosts []string, now time.Time) (*servingCert, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(servingValidity)
	if ca.cert.NotAfter.Before(notAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: ServiceName},
		NotBefore:    now.Add(-clockSkew),
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	life := leaf.NotAfter.Sub(now)
	return &servingCert{
		cert:    &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		issuer:  ca.cert,
		renewAt: now.Add(life * 2 / 3),
	}, nil
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
func (s *ServingCerts) Refresh(state *caState) (bool, error) {
	now := s.clock.Now()
	if c := s.cur.Load(); c != nil && c.issuer.Equal(state.current.cert) && now.Before(c.renewAt) {
		return false, nil
	}
	c, err := issueServing(state.current, s.hosts, now)
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

// Package pki is Strata's certificate authority: one self-signed CA kept in
// a Secret only the CA signer (casigner) reads, rotated in phases so that
// no peer is ever cut off; the certificates it signs — the identity
// certificates components present to each other (identity.go), which the
// managers ask for with CertificateSigningRequests (signer.go, requester.go,
// keeper.go); and the trust everyone else reads (trust.go).
//
// Certificates are made with crypto/x509 directly: client-go's cert helpers
// read the wall clock (rotation could not be tested with an injected clock)
// and cannot sign with a CA they are given.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

const (
	// CAValidity is how long a CA is valid; the leader replaces it
	// --ca-rotate-before (strata-manager ca-signer) before its expiry.
	CAValidity = 365 * 24 * time.Hour
	// ClockSkew backdates NotBefore so that a peer whose clock runs a little
	// behind still accepts a fresh certificate.
	ClockSkew = 5 * time.Minute
)

// Keys of the CA Secret.
const (
	KeyCACert   = "ca.crt"
	KeyCAKey    = "ca.key"
	KeyNextCert = "next-ca.crt"
	KeyNextKey  = "next-ca.key"
	// KeyBundle holds every CA certificate clients must trust: the current
	// one, the next one during a rotation, and a replaced one until it is
	// retired.
	KeyBundle = "ca-bundle.crt"
	// KeyPromotedAt is when the current CA replaced another (RFC 3339);
	// set until the replaced one is retired.
	KeyPromotedAt = "promoted-at"
)

// KeyPair is a certificate and its private key.
type KeyPair struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewKey is a new ECDSA P-256 key.
func NewKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// NewSerial is a random 128-bit serial number.
func NewSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// NewCA makes a self-signed CA valid for CAValidity from now.
func NewCA(now time.Time) (*KeyPair, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("strata-ca@%d", now.Unix())},
		NotBefore:             now.Add(-ClockSkew),
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
	return &KeyPair{Cert: cert, Key: key}, nil
}

// CertPEM encodes c as PEM.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// KeyPEM encodes the private key as PEM.
func (kp *KeyPair) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(kp.Key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// ParseKeyPair reads a PEM certificate and its EC private key.
func ParseKeyPair(certData, keyData []byte) (*KeyPair, error) {
	certs, err := ParseCerts(certData)
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
	return &KeyPair{Cert: certs[0], Key: key}, nil
}

// ParseCerts reads every PEM certificate in data.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
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

// CAState is the content of the CA Secret.
type CAState struct {
	Current *KeyPair
	Next    *KeyPair // only during a rotation
	// Bundle holds every CA certificate peers must trust: the current one,
	// the next one during a rotation, and a replaced one until Retire.
	Bundle []*x509.Certificate
	// PromotedAt is when Current replaced another CA; zero once the
	// replaced one is retired.
	PromotedAt time.Time
}

// NewCAState is the state of a new CA.
func NewCAState(now time.Time) (*CAState, error) {
	ca, err := NewCA(now)
	if err != nil {
		return nil, err
	}
	return &CAState{Current: ca, Bundle: []*x509.Certificate{ca.Cert}}, nil
}

// ParseCAState reads the CA Secret's data.
func ParseCAState(data map[string][]byte) (*CAState, error) {
	current, err := ParseKeyPair(data[KeyCACert], data[KeyCAKey])
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", KeyCACert, KeyCAKey, err)
	}
	s := &CAState{Current: current}
	if len(data[KeyNextCert]) > 0 {
		if s.Next, err = ParseKeyPair(data[KeyNextCert], data[KeyNextKey]); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", KeyNextCert, KeyNextKey, err)
		}
	}
	if s.Bundle, err = ParseCerts(data[KeyBundle]); err != nil {
		return nil, fmt.Errorf("%s: %w", KeyBundle, err)
	}
	if v := data[KeyPromotedAt]; len(v) > 0 {
		if s.PromotedAt, err = time.Parse(time.RFC3339, string(v)); err != nil {
			return nil, fmt.Errorf("%s: %w", KeyPromotedAt, err)
		}
	}
	// The bundle must hold the CAs in use, whatever was written.
	for _, kp := range []*KeyPair{s.Current, s.Next} {
		if kp != nil && !s.Trusts(kp.Cert) {
			s.Bundle = append(s.Bundle, kp.Cert)
		}
	}
	return s, nil
}

// Trusts reports whether c is in the bundle.
func (s *CAState) Trusts(c *x509.Certificate) bool {
	return slices.ContainsFunc(s.Bundle, func(b *x509.Certificate) bool { return b.Equal(c) })
}

// SecretData is the CA Secret's data for s.
func (s *CAState) SecretData() (map[string][]byte, error) {
	key, err := s.Current.KeyPEM()
	if err != nil {
		return nil, err
	}
	data := map[string][]byte{KeyCACert: CertPEM(s.Current.Cert), KeyCAKey: key, KeyBundle: s.BundlePEM()}
	if s.Next != nil {
		if data[KeyNextKey], err = s.Next.KeyPEM(); err != nil {
			return nil, err
		}
		data[KeyNextCert] = CertPEM(s.Next.Cert)
	}
	if !s.PromotedAt.IsZero() {
		data[KeyPromotedAt] = []byte(s.PromotedAt.UTC().Format(time.RFC3339))
	}
	return data, nil
}

// BundlePEM is the caBundle of the webhook configurations.
func (s *CAState) BundlePEM() []byte { return bundlePEM(s.Bundle) }

// Rotate is the CA signer's periodic step, in phases so that no component
// is ever cut off:
//
//  1. within rotateBefore of the current CA's expiry, a next CA is made and
//     added to the bundle; the signer publishes it (every manager and
//     instance manager trusts it, the webhook leader writes it into the
//     webhook configurations), while certificates still come from the
//     current CA;
//  2. Promote (below) makes the next CA current once the configurations
//     have carried it a while, and every keeper asks for its node's
//     certificates anew;
//  3. Retire (below) drops the replaced CA from the bundle once every
//     component has had the time to be signed anew: from then on a
//     certificate it signed (a stolen key's, the reason to rotate) is
//     refused.
//
// A CA that has already expired (a cluster switched off for a year) is
// replaced at once: nothing it signed is valid any more. Rotate reports
// whether s changed.
func (s *CAState) Rotate(now time.Time, rotateBefore time.Duration) (bool, error) {
	changed := false
	switch {
	case !now.Before(s.Current.Cert.NotAfter):
		if s.Next == nil || !now.Before(s.Next.Cert.NotAfter) {
			ca, err := NewCA(now)
			if err != nil {
				return false, err
			}
			s.Next = ca
		}
		s.Current, s.Next, s.PromotedAt, changed = s.Next, nil, now, true
	case s.Next == nil && !now.Before(s.Current.Cert.NotAfter.Add(-rotateBefore)):
		ca, err := NewCA(now)
		if err != nil {
			return false, err
		}
		s.Next, changed = ca, true
	}
	// Keep the bundle: CAs in use, and a replaced one until it is retired
	// or expires.
	bundle := s.Bundle[:0:0]
	for _, c := range s.Bundle {
		if now.Before(c.NotAfter) || c.Equal(s.Current.Cert) {
			bundle = append(bundle, c)
		}
	}
	for _, kp := range []*KeyPair{s.Current, s.Next} {
		if kp != nil && !slices.ContainsFunc(bundle, func(b *x509.Certificate) bool { return b.Equal(kp.Cert) }) {
			bundle = append(bundle, kp.Cert)
		}
	}
	if len(bundle) != len(s.Bundle) {
		changed = true
	}
	s.Bundle = bundle
	return changed, nil
}

// Promote makes the next CA current at now. The caller has had the bundle,
// which holds the next CA, in the configurations for promoteAfter.
func (s *CAState) Promote(now time.Time) {
	if s.Next != nil {
		s.Current, s.Next, s.PromotedAt = s.Next, nil, now
	}
}

// RetireDue is when the CA the current one replaced leaves the bundle:
// after, from its promotion; zero when there is none to retire.
func (s *CAState) RetireDue(after time.Duration) time.Time {
	if s.PromotedAt.IsZero() {
		return time.Time{}
	}
	return s.PromotedAt.Add(after)
}

// Retire keeps in the bundle only the CAs in use (the current one, and the
// next during a rotation), dropping those the current one replaced, and
// reports whether anything was dropped. The caller waits RetireDue first,
// so that every component holds a certificate of the current CA.
func (s *CAState) Retire() bool {
	bundle := s.Bundle[:0:0]
	for _, c := range s.Bundle {
		if c.Equal(s.Current.Cert) || (s.Next != nil && c.Equal(s.Next.Cert)) {
			bundle = append(bundle, c)
		}
	}
	changed := len(bundle) != len(s.Bundle) || !s.PromotedAt.IsZero()
	s.Bundle, s.PromotedAt = bundle, time.Time{}
	return changed
}

// AnnotationRotateCA on the CA Secret asks the CA signer to rotate the
// CA now, through the same two phases as a rotation on schedule (after a
// suspected key compromise, or to test that rotation breaks nothing). The
// leader removes it.
const AnnotationRotateCA = "strata.io/rotate-ca"

// StartRotation begins phase 1 now: a next CA joins the bundle. It reports
// false when a rotation is already under way.
func (s *CAState) StartRotation(now time.Time) (bool, error) {
	if s.Next != nil {
		return false, nil
	}
	ca, err := NewCA(now)
	if err != nil {
		return false, err
	}
	s.Next = ca
	s.Bundle = append(s.Bundle, ca.Cert)
	return true, nil
}

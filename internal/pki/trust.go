package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/strata-storage/strata/types"
)

// Trust is what the CA signer publishes in the ConfigMap
// types.CABundleConfigMap for everyone but itself: the CAs to trust and
// the one that signs now, never a key.
type Trust struct {
	// Signing is the CA that signs certificates now: one issued by another
	// is replaced.
	Signing *x509.Certificate
	// Bundle is every CA peers must trust (CAState.Bundle).
	Bundle []*x509.Certificate
}

// Trust is what s publishes.
func (s *CAState) Trust() *Trust { return &Trust{Signing: s.Current.Cert, Bundle: s.Bundle} }

// BundlePEM is the bundle, PEM-encoded (the webhook configurations'
// caBundle, the ConfigMap's ca.crt).
func (t *Trust) BundlePEM() []byte { return bundlePEM(t.Bundle) }

// Trusts reports whether c is in the bundle.
func (t *Trust) Trusts(c *x509.Certificate) bool {
	return slices.ContainsFunc(t.Bundle, func(b *x509.Certificate) bool { return b.Equal(c) })
}

// ConfigMapData is the ConfigMap's data for t.
func (t *Trust) ConfigMapData() map[string]string {
	return map[string]string{types.CABundleKey: string(t.BundlePEM()), types.SigningCAKey: string(CertPEM(t.Signing))}
}

// ParseTrust reads the ConfigMap's data: a bundle, and a signing CA that
// is one of it.
func ParseTrust(data map[string]string) (*Trust, error) {
	bundle, err := ParseCerts([]byte(data[types.CABundleKey]))
	if err != nil || len(bundle) == 0 {
		return nil, fmt.Errorf("%s: no CA certificate (%v)", types.CABundleKey, err)
	}
	signing, err := ParseCerts([]byte(data[types.SigningCAKey]))
	if err != nil || len(signing) != 1 {
		return nil, fmt.Errorf("%s: want one CA certificate (%v)", types.SigningCAKey, err)
	}
	t := &Trust{Signing: signing[0], Bundle: bundle}
	if !t.Trusts(t.Signing) {
		return nil, errors.New(types.SigningCAKey + ": not in the bundle")
	}
	return t, nil
}

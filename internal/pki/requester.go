package pki

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/url"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate/csr"
)

// identityUsages are what an identity certificate is for: both ends of a
// mutual TLS connection.
var identityUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature,
	certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}

// NewIdentityRequest makes a key and a PEM certificate request for id with
// hosts as SANs (as IssueIdentity would sign them): what a node component
// sends to SignerName. The key never leaves the requester.
func NewIdentityRequest(id Identity, hosts []string) (*tls.Certificate, []byte, error) {
	key, err := NewKey()
	if err != nil {
		return nil, nil, err
	}
	ips, names := splitHosts(hosts)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: id.Component + "@" + id.Node}, URIs: []*url.URL{id.URI()},
		IPAddresses: ips, DNSNames: names}, key)
	if err != nil {
		return nil, nil, err
	}
	return &tls.Certificate{PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// RequestIdentity asks SignerName for id's certificate through the
// CertificateSigningRequest API and waits until it is issued (client-go's
// csr helpers: the request is named after its content, so a requester
// that restarts finds its own again) or refused, or ctx ends. bundle gives
// the issuer among the CAs the requester trusts.
func RequestIdentity(ctx context.Context, kube kubernetes.Interface, id Identity, hosts []string,
	bundle []*x509.Certificate, now time.Time) (*IssuedCert, error) {
	cert, request, err := NewIdentityRequest(id, hosts)
	if err != nil {
		return nil, err
	}
	validity := IdentityValidity
	name, uid, err := csr.RequestCertificateWithContext(ctx, kube, request, "", SignerName, &validity, identityUsages, cert.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("asking %s for %s: %w", SignerName, id, err)
	}
	issued, err := csr.WaitForCertificate(ctx, kube, name, uid)
	if err != nil {
		return nil, fmt.Errorf("CertificateSigningRequest %s for %s: %w", name, id, err)
	}
	chain, err := ParseCerts(issued)
	if err != nil || len(chain) == 0 {
		return nil, fmt.Errorf("CertificateSigningRequest %s for %s: the issued certificate does not parse: %v", name, id, err)
	}
	leaf := chain[0]
	if got, err := IdentityOf(leaf); err != nil || got != id {
		return nil, fmt.Errorf("CertificateSigningRequest %s: issued for %v, not %s (%v)", name, got, id, err)
	}
	cert.Certificate, cert.Leaf = [][]byte{leaf.Raw}, leaf
	out := &IssuedCert{TLS: cert, RenewAt: now.Add(leaf.NotAfter.Sub(now) * 2 / 3)}
	for _, ca := range bundle {
		if leaf.CheckSignatureFrom(ca) == nil {
			out.Issuer = ca
		}
	}
	if out.Issuer == nil {
		return nil, fmt.Errorf("CertificateSigningRequest %s: %s's certificate is signed by no CA of the bundle", name, id)
	}
	return out, nil
}

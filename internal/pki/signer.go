package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The one-signer design (docs/security.md, issue 46): node components ask
// for their identities with Kubernetes CertificateSigningRequests of this
// signer, and only the signer holds the CA key. This file is the signer's
// judgement of a request and its signature; requester.go is the asking
// side; casigner runs the signer, Keeper asks it.

// SignerName is the CertificateSigningRequest signerName of Strata's
// identity certificates.
const SignerName = "strata.io/identity"

// NodeNameExtra is where the API server records, in a CSR's spec.extra,
// the node a requester's token is bound to (a Pod's projected token, or a
// TokenRequest bound to a Node).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// SigningPolicy is who may be signed what.
type SigningPolicy struct {
	// Requester is the one user whose requests are signed: the managers'
	// ServiceAccount (system:serviceaccount:<namespace>:strata-manager).
	Requester string
	// NodeAddresses are the addresses the named node reports (its Node's
	// status): the only IP SANs its certificates may carry besides
	// loopback.
	NodeAddresses func(node string) ([]net.IP, error)
	// ManagerDNSNames are the DNS names a manager's certificate may carry
	// besides its node's name and localhost (the API Service's names).
	ManagerDNSNames []string
}

// ErrRefused marks a request the signer denies: the reason is for the
// CSR's Denied condition.
var ErrRefused = errors.New("refused")

func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// Review checks a request for this signer and returns the identity and the
// parsed request to sign: from the Requester only, for one Strata identity
// of the node the requester's token is bound to, with a P-256 key, and SANs
// that name only that node (its addresses, loopback, its name) — so a
// node's stolen token cannot get another node's certificate.
func (p SigningPolicy) Review(csr *certificatesv1.CertificateSigningRequest) (Identity, *x509.CertificateRequest, error) {
	spec := csr.Spec
	switch {
	case spec.SignerName != SignerName:
		return Identity{}, nil, refused("signerName %q is not %s", spec.SignerName, SignerName)
	case spec.Username != p.Requester:
		return Identity{}, nil, refused("requester %q: only %s asks for Strata identities", spec.Username, p.Requester)
	}
	nodes := spec.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return Identity{}, nil, refused("the requester's token is bound to no node (%s: %v)", NodeNameExtra, nodes)
	}
	req, err := parseRequest(spec.Request)
	if err != nil {
		return Identity{}, nil, refused("request: %v", err)
	}
	id, err := requestedIdentity(req)
	if err != nil {
		return Identity{}, nil, refused("request: %v", err)
	}
	if id.Node != nodes[0] {
		return Identity{}, nil, refused("%s is for node %s, the requester's token is bound to node %s", id, id.Node, nodes[0])
	}
	if err := p.checkSANs(id, req); err != nil {
		return Identity{}, nil, err
	}
	return id, req, nil
}

func parseRequest(data []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("signature: %w", err)
	}
	if pub, ok := req.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		return nil, errors.New("the key must be ECDSA P-256")
	}
	if len(req.EmailAddresses) > 0 {
		return nil, errors.New("email addresses are not allowed")
	}
	return req, nil
}

// requestedIdentity is the request's one strata:// URI SAN, of a component
// that holds identities.
func requestedIdentity(req *x509.CertificateRequest) (Identity, error) {
	if len(req.URIs) != 1 {
		return Identity{}, fmt.Errorf("want exactly one strata:// URI, got %d URIs", len(req.URIs))
	}
	id, err := IdentityOf(&x509.Certificate{URIs: req.URIs, Subject: req.Subject})
	if err != nil {
		return Identity{}, err
	}
	if id.Component != ComponentManager && id.Component != ComponentInstanceManager {
		return Identity{}, fmt.Errorf("component %q holds no identity", id.Component)
	}
	return id, nil
}

// checkSANs: IP SANs are the node's own addresses or loopback; DNS names
// the node's name, localhost, and for a manager its API Service's names.
func (p SigningPolicy) checkSANs(id Identity, req *x509.CertificateRequest) error {
	if len(req.IPAddresses) > 0 {
		own, err := p.NodeAddresses(id.Node)
		if err != nil {
			return fmt.Errorf("addresses of node %s: %w", id.Node, err)
		}
		for _, ip := range req.IPAddresses {
			if !ip.IsLoopback() && !slices.ContainsFunc(own, ip.Equal) {
				return refused("%s asks for address %s, which node %s does not report", id, ip, id.Node)
			}
		}
	}
	allowed := []string{id.Node, "localhost"}
	if id.Component == ComponentManager {
		allowed = append(allowed, p.ManagerDNSNames...)
	}
	for _, name := range req.DNSNames {
		if !slices.Contains(allowed, name) {
			return refused("%s asks for DNS name %q (allowed: %v)", id, name, allowed)
		}
	}
	return nil
}

// SignRequest signs a reviewed request for id with ca: the SANs it asked
// for, for IdentityValidity (never past the CA's), PEM-encoded as a CSR's
// status.certificate.
func SignRequest(ca *KeyPair, id Identity, req *x509.CertificateRequest, now time.Time) ([]byte, error) {
	der, err := signIdentity(ca, id, req.PublicKey, req.IPAddresses, req.DNSNames, now)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// Signer judges and signs the pending requests of SignerName with its CA.
type Signer struct {
	Policy SigningPolicy
	Kube   kubernetes.Interface
	// CA is the key pair that signs now (the CA state's Current).
	CA  func() (*KeyPair, error)
	Now func() time.Time
}

// Handle settles one request: a refused one is Denied with the reason; an
// admitted one is Approved and signed. A request already signed, denied or
// failed, or of another signer, is left alone, so Handle is idempotent.
func (s *Signer) Handle(ctx context.Context, req *certificatesv1.CertificateSigningRequest) error {
	if req.Spec.SignerName != SignerName || len(req.Status.Certificate) > 0 || settled(req) {
		return nil
	}
	id, parsed, err := s.Policy.Review(req)
	if errors.Is(err, ErrRefused) {
		return s.decide(ctx, req, certificatesv1.CertificateDenied, "StrataRefused", err.Error())
	}
	if err != nil {
		return err // the signer's own trouble (a Node not read): try again
	}
	ca, err := s.CA()
	if err != nil {
		return err
	}
	cert, err := SignRequest(ca, id, parsed, s.Now())
	if err != nil {
		return err
	}
	if !approved(req) {
		if err := s.decide(ctx, req, certificatesv1.CertificateApproved, "StrataApproved",
			fmt.Sprintf("%s for the node its requester's token is bound to", id)); err != nil {
			return err
		}
		if req, err = s.Kube.CertificatesV1().CertificateSigningRequests().Get(ctx, req.Name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	req = req.DeepCopy()
	req.Status.Certificate = cert
	_, err = s.Kube.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, req, metav1.UpdateOptions{})
	return err
}

func (s *Signer) decide(ctx context.Context, req *certificatesv1.CertificateSigningRequest,
	kind certificatesv1.RequestConditionType, reason, message string) error {
	req = req.DeepCopy()
	req.Status.Conditions = append(req.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: kind, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastUpdateTime: metav1.Now()})
	_, err := s.Kube.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, req.Name, req, metav1.UpdateOptions{})
	return err
}

func hasCondition(req *certificatesv1.CertificateSigningRequest, kind certificatesv1.RequestConditionType) bool {
	return slices.ContainsFunc(req.Status.Conditions, func(c certificatesv1.CertificateSigningRequestCondition) bool {
		return c.Type == kind && c.Status == corev1.ConditionTrue
	})
}

func approved(req *certificatesv1.CertificateSigningRequest) bool {
	return hasCondition(req, certificatesv1.CertificateApproved)
}

func settled(req *certificatesv1.CertificateSigningRequest) bool {
	return hasCondition(req, certificatesv1.CertificateDenied) || hasCondition(req, certificatesv1.CertificateFailed)
}

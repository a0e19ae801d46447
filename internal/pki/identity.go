package pki

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Components that hold identity certificates. A listener names the
// components it accepts; a certificate of any other is refused at the
// handshake even though the CA signed it.
const (
	ComponentManager         = "manager"
	ComponentInstanceManager = "instance-manager"
)

// IdentityValidity is an identity certificate's life (never past its CA's);
// it is renewed two thirds into it, so a stolen key is useful for days,
// not a year.
const IdentityValidity = 7 * 24 * time.Hour

// identityScheme is the URI SAN scheme: strata://<component>/<node>.
const identityScheme = "strata"

// Identity is who a certificate speaks for: a component of one node.
type Identity struct {
	Component string
	Node      string
}

func (id Identity) String() string { return id.URI().String() }

// URI is the certificate's URI SAN, strata://<component>/<node>.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: identityScheme, Host: id.Component, Path: "/" + id.Node}
}

// IdentityOf reads the identity a certificate was issued for.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	for _, u := range c.URIs {
		if u.Scheme != identityScheme {
			continue
		}
		node := strings.TrimPrefix(u.Path, "/")
		if u.Host == "" || node == "" || strings.Contains(node, "/") {
			return Identity{}, fmt.Errorf("certificate %q: malformed identity %q", c.Subject.CommonName, u)
		}
		return Identity{Component: u.Host, Node: node}, nil
	}
	return Identity{}, fmt.Errorf("certificate %q names no Strata identity", c.Subject.CommonName)
}

// IssuedCert is an identity certificate and when to replace it.
type IssuedCert struct {
	TLS     *tls.Certificate
	Issuer  *x509.Certificate
	RenewAt time.Time
}

// IssueIdentity signs a certificate for id, valid for both ends of a
// connection. hosts (IP addresses and DNS names) are added for clients
// that check host names, such as a user's curl against the API; Strata's
// own peers check the identity instead.
func IssueIdentity(ca *KeyPair, id Identity, hosts []string, now time.Time) (*IssuedCert, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	ips, names := splitHosts(hosts)
	der, err := signIdentity(ca, id, key.Public(), ips, names, now)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &IssuedCert{
		TLS:     &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		Issuer:  ca.Cert,
		RenewAt: now.Add(leaf.NotAfter.Sub(now) * 2 / 3),
	}, nil
}

// splitHosts sorts hosts into IP addresses (the unspecified address
// dropped) and DNS names (each once).
func splitHosts(hosts []string) ([]net.IP, []string) {
	var ips []net.IP
	var names []string
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() {
				ips = append(ips, ip)
			}
		} else if h != "" && !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	return ips, names
}

// signIdentity signs pub's certificate for id and the given SANs with ca:
// for IdentityValidity (never past the CA's), usable as client and server.
func signIdentity(ca *KeyPair, id Identity, pub any, ips []net.IP, names []string, now time.Time) ([]byte, error) {
	if id.Component == "" || id.Node == "" || strings.Contains(id.Node, "/") {
		return nil, fmt.Errorf("identity %+v: want a component and a node name", id)
	}
	serial, err := NewSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(IdentityValidity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id.Component + "@" + id.Node},
		NotBefore:    now.Add(-ClockSkew),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URI()},
		IPAddresses:  ips,
		DNSNames:     names,
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

// IssuedFor reports whether c is valid for every one of hosts (IP
// addresses or DNS names), as a client dialling each would check it.
func IssuedFor(c *x509.Certificate, hosts []string) bool {
	return !slices.ContainsFunc(hosts, func(h string) bool { return c.VerifyHostname(h) != nil })
}

// Due reports whether c must be replaced at now: none yet, signed by a CA
// that no longer signs (signing), or two thirds into its life.
func (c *IssuedCert) Due(signing *x509.Certificate, now time.Time) bool {
	return c == nil || !c.Issuer.Equal(signing) || !now.Before(c.RenewAt)
}

// ServiceDNSNames are the in-cluster DNS names of a Service: the ones a
// manager's certificates may carry for the chart's Services in front of
// every manager (the HTTPS API's, the webhook's).
func ServiceDNSNames(service, namespace string) []string {
	svc := service + "." + namespace
	return []string{service, svc, svc + ".svc", svc + ".svc.cluster.local"}
}

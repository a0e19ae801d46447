package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
)

// Source is where a TLS endpoint reads its certificate and the CAs it
// trusts, at every handshake: a rotation needs no restart, and
// established connections keep their session.
type Source interface {
	Certificate() (*tls.Certificate, error)
	Roots() (*x509.CertPool, error)
}

// ServerConfig makes a listener that accepts only clients presenting a
// certificate of the Strata CA for one of the allowed components.
func ServerConfig(src Source, allow ...string) *tls.Config {
	return &tls.Config{
		MinVersion:            tls.VersionTLS13,
		ClientAuth:            tls.RequireAnyClientCert,
		GetCertificate:        func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return src.Certificate() },
		VerifyPeerCertificate: verifyPeer(src, false, allow),
	}
}

// UserOrPeerServerConfig serves its certificate to everyone and asks for a
// client certificate without requiring one. One that is presented must
// verify either as a Strata component in allow (src's roots) or by users
// (the cluster's client CA, for kubeconfigs that authenticate with a
// certificate); nil users accepts components only. The listener lets both
// kinds through, so a handler checks again which one it has: VerifiedPeer
// for components, the user authenticator for users.
func UserOrPeerServerConfig(src Source, users func() (x509.VerifyOptions, bool), allow ...string) *tls.Config {
	cfg := ServerConfig(src, allow...)
	cfg.MinVersion = tls.VersionTLS12 // users' tools
	cfg.ClientAuth = tls.RequestClientCert
	peer := verifyPeer(src, true, allow)
	cfg.VerifyPeerCertificate = func(raw [][]byte, chains [][]*x509.Certificate) error {
		peerErr := peer(raw, chains)
		if peerErr == nil || users == nil {
			return peerErr
		}
		if opts, ok := users(); ok {
			if err := verifyUser(opts, raw); err == nil {
				return nil
			}
		}
		return peerErr
	}
	return cfg
}

// verifyUser checks a client certificate chain against opts (a client CA)
// for client authentication.
func verifyUser(opts x509.VerifyOptions, raw [][]byte) error {
	certs, err := parseChain(raw)
	if err != nil {
		return err
	}
	opts.Intermediates = x509.NewCertPool()
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	_, err = certs[0].Verify(opts)
	return err
}

// UserServerConfig serves its certificate to everyone and asks for no
// client certificate: for listeners that only users reach and that
// authenticate them otherwise (the metrics port's bearer tokens), where a
// scraper's unrelated client certificate must not break the handshake.
func UserServerConfig(src Source) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12, // users' tools
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return src.Certificate() },
	}
}

// ClientConfig dials servers presenting a certificate of the Strata CA for
// one of the allowed components, with src's certificate as the client's.
//
// Host names are not checked (InsecureSkipVerify only turns off Go's
// default check): replicas are reached at addresses and ports that change
// with every start, so the chain and the identity are verified by
// verifyPeer instead.
func ClientConfig(src Source, allow ...string) *tls.Config {
	return &tls.Config{
		MinVersion:            tls.VersionTLS13,
		InsecureSkipVerify:    true, //nolint:gosec // verifyPeer checks chain and identity
		GetClientCertificate:  func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return src.Certificate() },
		VerifyPeerCertificate: verifyPeer(src, false, allow),
	}
}

// ForAddress is cfg (a ClientConfig) for a dial to address (host:port): the
// server's certificate must also be issued for that host (an IP or DNS
// SAN), so that a peer presenting another node's certificate — stolen, or
// on an address it took over — is refused; the identity alone names a
// component, which every node's certificate does. A certificate without
// any IP or DNS SAN (from before they were issued) is refused too. nil
// stays nil (plain connections of in-process tests).
func ForAddress(cfg *tls.Config, address string) *tls.Config {
	if cfg == nil {
		return nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	out := cfg.Clone()
	out.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no certificate presented")
		}
		leaf := cs.PeerCertificates[0]
		if err := leaf.VerifyHostname(host); err != nil {
			id, _ := IdentityOf(leaf)
			return fmt.Errorf("peer %s at %s: its certificate is not for this address (issued for %v %v): "+
				"another node's certificate", id, address, leaf.IPAddresses, leaf.DNSNames)
		}
		return nil
	}
	return out
}

// DialTLSContext dials with cfg bound to each dialled address (ForAddress):
// an http.Transport's DialTLSContext; nil for a nil cfg (plain HTTP).
func DialTLSContext(cfg *tls.Config) func(ctx context.Context, network, address string) (net.Conn, error) {
	if cfg == nil {
		return nil
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		d := &tls.Dialer{Config: ForAddress(cfg, address)}
		return d.DialContext(ctx, network, address)
	}
}

// verifyPeer checks the peer's chain against src's current roots and its
// identity against allow.
func verifyPeer(src Source, optional bool, allow []string) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			if optional {
				return nil
			}
			return errors.New("no certificate presented")
		}
		_, err := verifyChain(src, raw, allow)
		return err
	}
}

func verifyChain(src Source, raw [][]byte, allow []string) (Identity, error) {
	roots, err := src.Roots()
	if err != nil {
		return Identity{}, err
	}
	certs, err := parseChain(raw)
	if err != nil {
		return Identity{}, err
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return Identity{}, fmt.Errorf("peer certificate %q: %w", certs[0].Subject.CommonName, err)
	}
	id, err := IdentityOf(certs[0])
	if err != nil {
		return Identity{}, err
	}
	if !slices.Contains(allow, id.Component) {
		return Identity{}, fmt.Errorf("peer %s is not allowed here (accepted: %v)", id, allow)
	}
	return id, nil
}

func parseChain(raw [][]byte) ([]*x509.Certificate, error) {
	if len(raw) == 0 {
		return nil, errors.New("no certificate presented")
	}
	certs := make([]*x509.Certificate, 0, len(raw))
	for _, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return nil, fmt.Errorf("peer certificate: %w", err)
		}
		certs = append(certs, c)
	}
	return certs, nil
}

// VerifiedPeer is the identity of a TLS peer whose certificate chains to
// src's roots and names a component in allow. It verifies the chain again:
// a listener of UserOrPeerServerConfig also admits users' certificates of
// another CA, whose subject could be made to read like a component's.
func VerifiedPeer(src Source, cs *tls.ConnectionState, allow ...string) (Identity, error) {
	if cs == nil || len(cs.PeerCertificates) == 0 {
		return Identity{}, errors.New("no client certificate was presented")
	}
	raw := make([][]byte, len(cs.PeerCertificates))
	for i, c := range cs.PeerCertificates {
		raw[i] = c.Raw
	}
	return verifyChain(src, raw, allow)
}

// MemorySource holds a certificate and roots in memory (a manager's own,
// issued from the CA Secret it reads).
type MemorySource struct {
	cur atomic.Pointer[memoryState]
}

type memoryState struct {
	cert  *IssuedCert
	roots *x509.CertPool
}

// Set replaces the certificate and the roots.
func (m *MemorySource) Set(cert *IssuedCert, bundle []*x509.Certificate) {
	pool := x509.NewCertPool()
	for _, c := range bundle {
		pool.AddCert(c)
	}
	m.cur.Store(&memoryState{cert: cert, roots: pool})
}

// Issued is the current certificate; nil before the first Set.
func (m *MemorySource) Issued() *IssuedCert {
	if s := m.cur.Load(); s != nil {
		return s.cert
	}
	return nil
}

// Certificate implements Source.
func (m *MemorySource) Certificate() (*tls.Certificate, error) {
	if s := m.cur.Load(); s != nil {
		return s.cert.TLS, nil
	}
	return nil, errors.New("no certificate issued yet")
}

// Roots implements Source.
func (m *MemorySource) Roots() (*x509.CertPool, error) {
	if s := m.cur.Load(); s != nil {
		return s.roots, nil
	}
	return nil, errors.New("no CA bundle yet")
}

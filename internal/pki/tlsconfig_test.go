package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Now()

func newState(t *testing.T) *CAState {
	t.Helper()
	s, err := NewCAState(t0)
	require.NoError(t, err)
	return s
}

func memSource(t *testing.T, ca *CAState, id Identity, trust ...*x509.Certificate) *MemorySource {
	t.Helper()
	c, err := IssueIdentity(ca.Current, id, nil, t0)
	require.NoError(t, err)
	var m MemorySource
	if trust == nil {
		trust = ca.Bundle
	}
	m.Set(c, trust)
	return &m
}

// handshake runs a TLS handshake over a real TCP connection and returns the
// client's and the server's errors.
func handshake(t *testing.T, server, client *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		done <- tls.Server(c, server).Handshake()
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	c := tls.Client(raw, client)
	clientErr = c.Handshake()
	if clientErr == nil {
		// TLS 1.3: the client learns of a refused certificate on its first read.
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, clientErr = c.Read(make([]byte, 1))
		if ne, ok := clientErr.(net.Error); (ok && ne.Timeout()) || errors.Is(clientErr, io.EOF) {
			clientErr = nil // the server accepted and hung up
		}
	}
	c.Close()
	return clientErr, <-done
}

func TestPeersAreCheckedByIdentity(t *testing.T) {
	ca, other := newState(t), newState(t)
	im := Identity{Component: ComponentInstanceManager, Node: "n1"}
	mgr := Identity{Component: ComponentManager, Node: "n2"}
	server := memSource(t, ca, im)
	for _, tc := range []struct {
		name   string
		client *tls.Config
		allow  []string
		ok     bool
	}{
		{"manager of any node", ClientConfig(memSource(t, ca, mgr), ComponentInstanceManager), []string{ComponentManager}, true},
		{"wrong component", ClientConfig(memSource(t, ca, im), ComponentInstanceManager), []string{ComponentManager}, false},
		{"another CA", ClientConfig(memSource(t, other, mgr, ca.Bundle...), ComponentInstanceManager), []string{ComponentManager}, false},
		{"no certificate", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}, []string{ComponentManager}, false}, //nolint:gosec
	} {
		t.Run(tc.name, func(t *testing.T) {
			cerr, serr := handshake(t, ServerConfig(server, tc.allow...), tc.client)
			if tc.ok {
				assert.NoError(t, cerr)
				assert.NoError(t, serr)
			} else {
				assert.Error(t, serr, "the server must refuse")
			}
		})
	}
	t.Run("client refuses a server of the wrong component", func(t *testing.T) {
		cerr, _ := handshake(t, ServerConfig(memSource(t, ca, mgr), ComponentManager),
			ClientConfig(memSource(t, ca, mgr), ComponentInstanceManager))
		require.Error(t, cerr)
		assert.Contains(t, cerr.Error(), "not allowed here")
	})
	t.Run("client refuses a server of another CA", func(t *testing.T) {
		cerr, _ := handshake(t, ServerConfig(memSource(t, other, im, ca.Bundle...), ComponentManager),
			ClientConfig(memSource(t, ca, mgr), ComponentInstanceManager))
		require.Error(t, cerr)
	})
	t.Run("optional client certificate", func(t *testing.T) {
		cerr, serr := handshake(t, UserOrPeerServerConfig(server, nil, ComponentManager),
			&tls.Config{InsecureSkipVerify: true}) //nolint:gosec
		assert.NoError(t, cerr)
		assert.NoError(t, serr)
		_, serr = handshake(t, UserOrPeerServerConfig(server, nil, ComponentManager),
			ClientConfig(memSource(t, other, mgr, ca.Bundle...), ComponentInstanceManager))
		assert.Error(t, serr, "a certificate, when given, must verify")
	})
	t.Run("a user's certificate of the users' CA", func(t *testing.T) {
		users := func() (x509.VerifyOptions, bool) {
			pool := x509.NewCertPool()
			pool.AddCert(other.Current.Cert)
			return x509.VerifyOptions{Roots: pool}, true
		}
		user := memSource(t, other, mgr, ca.Bundle...)
		_, serr := handshake(t, UserOrPeerServerConfig(server, users, ComponentManager),
			ClientConfig(user, ComponentInstanceManager))
		assert.NoError(t, serr, "the listener admits a user of the cluster's client CA")
		_, serr = handshake(t, UserOrPeerServerConfig(server, users, ComponentManager),
			ClientConfig(memSource(t, newState(t), mgr, ca.Bundle...), ComponentInstanceManager))
		assert.Error(t, serr, "a certificate of neither CA is refused")

		leaf, err := user.Certificate()
		require.NoError(t, err)
		_, err = VerifiedPeer(server, &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf.Leaf}}, ComponentManager)
		assert.Error(t, err, "a user's certificate naming a component is no Strata peer")
		peerLeaf, err := memSource(t, ca, mgr).Certificate()
		require.NoError(t, err)
		id, err := VerifiedPeer(server, &tls.ConnectionState{PeerCertificates: []*x509.Certificate{peerLeaf.Leaf}}, ComponentManager)
		require.NoError(t, err)
		assert.Equal(t, mgr, id)
		_, err = VerifiedPeer(server, &tls.ConnectionState{}, ComponentManager)
		assert.ErrorContains(t, err, "no client certificate")
	})
}

func TestIdentityRoundTrip(t *testing.T) {
	ca := newState(t)
	id := Identity{Component: ComponentManager, Node: "node-1.example"}
	c, err := IssueIdentity(ca.Current, id, []string{"10.0.0.1", "node-1", "0.0.0.0"}, t0)
	require.NoError(t, err)
	got, err := IdentityOf(c.TLS.Leaf)
	require.NoError(t, err)
	assert.Equal(t, id, got)
	assert.Equal(t, "strata://manager/node-1.example", id.String())
	assert.Len(t, c.TLS.Leaf.IPAddresses, 1)
	assert.Equal(t, []string{"node-1"}, c.TLS.Leaf.DNSNames)
	assert.False(t, c.Due(ca.Current.Cert, t0))
	assert.True(t, c.Due(ca.Current.Cert, t0.Add(IdentityValidity*2/3+time.Second)))
	_, err = IssueIdentity(ca.Current, Identity{Component: "manager", Node: "a/b"}, nil, t0)
	assert.Error(t, err)
}

func TestDirSourceFollowsTheFiles(t *testing.T) {
	dir := t.TempDir() + "/tls"
	ca := newState(t)
	now := t0
	src := NewDirSource(dir)
	src.now = func() time.Time { return now }
	_, err := src.Certificate()
	require.Error(t, err, "nothing written yet")

	first, err := IssueIdentity(ca.Current, Identity{Component: ComponentInstanceManager, Node: "n1"}, nil, t0)
	require.NoError(t, err)
	require.NoError(t, WriteDir(dir, first, ca.Bundle))
	got, err := src.Certificate()
	require.NoError(t, err)
	assert.Equal(t, first.TLS.Certificate[0], got.Certificate[0])

	second, err := IssueIdentity(ca.Current, Identity{Component: ComponentInstanceManager, Node: "n1"}, nil, t0)
	require.NoError(t, err)
	require.NoError(t, WriteDir(dir, second, ca.Bundle))
	got, _ = src.Certificate()
	assert.Equal(t, first.TLS.Certificate[0], got.Certificate[0], "checked at most once a second")
	now = now.Add(time.Second)
	got, _ = src.Certificate()
	assert.Equal(t, second.TLS.Certificate[0], got.Certificate[0], "the renewed certificate is served")

	// A damaged file keeps the last good certificate.
	require.NoError(t, writeRaw(dir+"/"+IdentityFile, "garbage"))
	now = now.Add(time.Second)
	got, err = src.Certificate()
	require.NoError(t, err)
	assert.Equal(t, second.TLS.Certificate[0], got.Certificate[0])
}

func writeRaw(path, data string) error { return os.WriteFile(path, []byte(data), 0o600) }

// A client bound to the address it dials (ForAddress) refuses a server
// whose certificate was issued for another node's address, though the CA
// signed it and it names the right component: an engine dialling node B's
// replica refuses node A's certificate. A certificate naming no address
// (from before they were issued) is refused as well.
func TestClientsCheckTheNodeTheyMeantToReach(t *testing.T) {
	ca := newState(t)
	client := ClientConfig(memSource(t, ca, Identity{Component: ComponentManager, Node: "n0"}), ComponentInstanceManager)
	issued := func(node string, hosts ...string) *MemorySource {
		c, err := IssueIdentity(ca.Current, Identity{Component: ComponentInstanceManager, Node: node}, hosts, t0)
		require.NoError(t, err)
		var m MemorySource
		m.Set(c, ca.Bundle)
		return &m
	}
	for _, tc := range []struct {
		name    string
		server  *MemorySource
		wantErr string
	}{
		{"node B's own certificate", issued("node-b", "127.0.0.2"), ""},
		{"node A's certificate at node B's address", issued("node-a", "127.0.0.1"),
			"peer strata://instance-manager/node-a at 127.0.0.2:"},
		{"a certificate naming no address", issued("node-b"), "its certificate is not for this address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.2:0")
			require.NoError(t, err)
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err == nil {
					_ = tls.Server(c, ServerConfig(tc.server, ComponentManager)).Handshake()
					c.Close()
				}
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer raw.Close()
			err = tls.Client(raw, ForAddress(client, ln.Addr().String())).Handshake()
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
	assert.Nil(t, ForAddress(nil, "127.0.0.1:1"), "plain stays plain")
}

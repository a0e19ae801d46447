package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

const testRequester = "system:serviceaccount:strata-system:strata-manager"

var testPolicy = SigningPolicy{
	Requester: testRequester,
	NodeAddresses: func(node string) ([]net.IP, error) {
		return map[string][]net.IP{"n1": {net.ParseIP("10.0.0.1")}, "n2": {net.ParseIP("10.0.0.2")}}[node], nil
	},
	ManagerDNSNames: []string{"strata-api.strata-system.svc"},
}

// csrFor is a request as the API server stores it: the requester's user
// and the node its token is bound to filled in.
func csrFor(t *testing.T, request []byte, user, tokenNode string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	extra := map[string]certificatesv1.ExtraValue{}
	if tokenNode != "" {
		extra[NodeNameExtra] = certificatesv1.ExtraValue{tokenNode}
	}
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-1"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: request, SignerName: SignerName, Username: user,
			Extra: extra, Usages: identityUsages}}
}

func identityRequest(t *testing.T, id Identity, hosts ...string) []byte {
	t.Helper()
	_, req, err := NewIdentityRequest(id, hosts)
	require.NoError(t, err)
	return req
}

// A request is signed only for the node its requester's token is bound
// to, with SANs that name only that node: a node's stolen token gets no
// other node's certificate (issue 46).
func TestSigningPolicy(t *testing.T) {
	mgr1 := Identity{Component: ComponentManager, Node: "n1"}
	im1 := Identity{Component: ComponentInstanceManager, Node: "n1"}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	rsaDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{mgr1.URI()}}, rsaKey)
	require.NoError(t, err)
	_, twoKey, err := NewIdentityRequest(mgr1, nil)
	require.NoError(t, err)
	twoURIs := func() []byte {
		key, err := NewKey()
		require.NoError(t, err)
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "x"},
			URIs: []*url.URL{mgr1.URI(), im1.URI()}}, key)
		require.NoError(t, err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}()
	for _, tc := range []struct {
		name      string
		csr       *certificatesv1.CertificateSigningRequest
		wantErr   string
		wantIdent Identity
	}{
		{name: "a manager's", csr: csrFor(t, identityRequest(t, mgr1, "10.0.0.1", "127.0.0.1", "n1", "localhost",
			"strata-api.strata-system.svc"), testRequester, "n1"), wantIdent: mgr1},
		{name: "an instance manager's", csr: csrFor(t, identityRequest(t, im1, "10.0.0.1"), testRequester, "n1"), wantIdent: im1},
		{name: "another node's", csr: csrFor(t, identityRequest(t, mgr1, "10.0.0.1"), testRequester, "n2"),
			wantErr: "strata://manager/n1 is for node n1, the requester's token is bound to node n2"},
		{name: "another node's address", csr: csrFor(t, identityRequest(t, im1, "10.0.0.2"), testRequester, "n1"),
			wantErr: "asks for address 10.0.0.2, which node n1 does not report"},
		{name: "the API Service for an instance manager", csr: csrFor(t, identityRequest(t, im1, "strata-api.strata-system.svc"),
			testRequester, "n1"), wantErr: `asks for DNS name "strata-api.strata-system.svc"`},
		{name: "another requester", csr: csrFor(t, identityRequest(t, mgr1), "system:serviceaccount:apps:alice", "n1"),
			wantErr: `requester "system:serviceaccount:apps:alice"`},
		{name: "a token bound to no node", csr: csrFor(t, identityRequest(t, mgr1), testRequester, ""),
			wantErr: "bound to no node"},
		{name: "a component without identities", csr: csrFor(t, identityRequest(t, Identity{Component: "webhook", Node: "n1"}),
			testRequester, "n1"), wantErr: `component "webhook" holds no identity`},
		{name: "an RSA key", csr: csrFor(t, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: rsaDER}),
			testRequester, "n1"), wantErr: "ECDSA P-256"},
		{name: "two identities", csr: csrFor(t, twoURIs, testRequester, "n1"), wantErr: "exactly one strata:// URI"},
		{name: "not PEM", csr: csrFor(t, []byte("hello"), testRequester, "n1"), wantErr: "not a PEM CERTIFICATE REQUEST"},
		{name: "another signer", csr: func() *certificatesv1.CertificateSigningRequest {
			c := csrFor(t, twoKey, testRequester, "n1")
			c.Spec.SignerName = "kubernetes.io/kube-apiserver-client"
			return c
		}(), wantErr: `signerName "kubernetes.io/kube-apiserver-client"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, req, err := testPolicy.Review(tc.csr)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrRefused)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantIdent, id)
			assert.NotNil(t, req)
		})
	}
}

// The signer approves and signs an admitted request (the certificate names
// what was asked, chains to the CA, and is the requester's key's), denies
// a refused one with the reason, and leaves a settled one alone.
func TestSignerHandlesRequests(t *testing.T) {
	state := newState(t)
	ctx := context.Background()
	im1 := Identity{Component: ComponentInstanceManager, Node: "n1"}
	for _, tc := range []struct {
		name       string
		tokenNode  string
		wantSigned bool
	}{
		{"its own node", "n1", true},
		{"another node's token", "n2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, request, err := NewIdentityRequest(im1, []string{"10.0.0.1"})
			require.NoError(t, err)
			kube := fake.NewClientset(csrFor(t, request, testRequester, tc.tokenNode))
			s := &Signer{Policy: testPolicy, Kube: kube, CA: func() (*KeyPair, error) { return state.Current, nil }, Now: time.Now}
			get := func() *certificatesv1.CertificateSigningRequest {
				c, err := kube.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-1", metav1.GetOptions{})
				require.NoError(t, err)
				return c
			}
			require.NoError(t, s.Handle(ctx, get()))
			got := get()
			if !tc.wantSigned {
				assert.True(t, hasCondition(got, certificatesv1.CertificateDenied))
				assert.Empty(t, got.Status.Certificate)
				assert.Contains(t, got.Status.Conditions[0].Message, "bound to node n2")
			} else {
				assert.True(t, approved(got))
				chain, err := ParseCerts(got.Status.Certificate)
				require.NoError(t, err)
				require.Len(t, chain, 1)
				assert.NoError(t, chain[0].CheckSignatureFrom(state.Current.Cert))
				gotID, err := IdentityOf(chain[0])
				require.NoError(t, err)
				assert.Equal(t, im1, gotID)
				assert.NoError(t, chain[0].VerifyHostname("10.0.0.1"))
				assert.True(t, key.PrivateKey.(*ecdsa.PrivateKey).PublicKey.Equal(chain[0].PublicKey), "the requester's key")
			}
			before := len(kube.Actions())
			require.NoError(t, s.Handle(ctx, got))
			assert.Len(t, kube.Actions(), before, "a settled request is left alone")
		})
	}
}

// A node component asks through the API and gets the certificate the
// signer issued, for the key it made and kept, with its issuer found in
// its bundle; a refused request is an error naming the reason.
func TestRequestIdentityThroughTheAPI(t *testing.T) {
	state := newState(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, tokenNode, wantErr string
	}{
		{name: "issued", tokenNode: "n1"},
		{name: "refused", tokenNode: "n2", wantErr: "denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset()
			s := &Signer{Policy: testPolicy, Kube: kube, CA: func() (*KeyPair, error) { return state.Current, nil }, Now: time.Now}
			id := Identity{Component: ComponentInstanceManager, Node: "n1"}
			type result struct {
				c   *IssuedCert
				err error
			}
			done := make(chan result, 1)
			go func() {
				c, err := RequestIdentity(ctx, kube, id, []string{"10.0.0.1"}, state.Bundle, time.Now())
				done <- result{c, err}
			}()
			// The signer's side, with what the API server records about the
			// requester (the fake records nothing).
			require.Eventually(t, func() bool {
				list, err := kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
				if err != nil || len(list.Items) == 0 {
					return false
				}
				req := list.Items[0].DeepCopy()
				req.Spec.Username, req.Spec.Extra = testRequester, map[string]certificatesv1.ExtraValue{NodeNameExtra: {tc.tokenNode}}
				req, err = kube.CertificatesV1().CertificateSigningRequests().Update(ctx, req, metav1.UpdateOptions{})
				return err == nil && s.Handle(ctx, req) == nil
			}, 10*time.Second, 20*time.Millisecond)
			r := <-done
			if tc.wantErr != "" {
				require.Error(t, r.err)
				assert.Contains(t, r.err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, r.err)
			assert.True(t, r.c.Issuer.Equal(state.Current.Cert))
			gotID, err := IdentityOf(r.c.TLS.Leaf)
			require.NoError(t, err)
			assert.Equal(t, id, gotID)
			// The key and the certificate make a pair a peer accepts.
			var m MemorySource
			m.Set(r.c, state.Bundle)
			cerr, serr := handshake(t, ServerConfig(&m, ComponentManager),
				ClientConfig(memSource(t, state, Identity{Component: ComponentManager, Node: "n2"}), ComponentInstanceManager))
			assert.NoError(t, cerr)
			assert.NoError(t, serr)
		})
	}
}

// Run settles the requests of its signer as they come, and leaves other
// signers' alone.
func TestSignerRunSettlesRequests(t *testing.T) {
	state := newState(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, request, err := NewIdentityRequest(Identity{Component: ComponentManager, Node: "n1"}, []string{"10.0.0.1"})
	require.NoError(t, err)
	mine := csrFor(t, request, testRequester, "n1")
	other := csrFor(t, request, testRequester, "n1")
	other.Name, other.Spec.SignerName = "csr-other", "example.com/other"
	kube := fake.NewClientset(mine, other)
	s := &Signer{Policy: testPolicy, Kube: kube, CA: func() (*KeyPair, error) { return state.Current, nil }, Now: time.Now}
	done := make(chan struct{})
	go func() {
		s.Run(ctx, logrus.New())
		close(done)
	}()
	get := func(name string) *certificatesv1.CertificateSigningRequest {
		c, err := kube.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		return c
	}
	require.Eventually(t, func() bool { return len(get("csr-1").Status.Certificate) > 0 }, 10*time.Second, 20*time.Millisecond)
	assert.True(t, approved(get("csr-1")))
	assert.Empty(t, get("csr-other").Status.Conditions, "another signer's request")
	cancel()
	<-done
}

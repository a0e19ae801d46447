package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
)

// testCA signs client certificates as a cluster's client CA does.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cluster-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key}
}

func (ca *testCA) pem() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))
}

// client is a client certificate for user in groups.
func (ca *testCA) client(t *testing.T, user string, groups ...string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: user, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

// The cluster's client CA is followed from its ConfigMap: known once
// written, replaced when it changes, forgotten when it goes or does not
// parse (certificates are then refused, never let through unchecked).
func TestClusterClientCAFollowsItsConfigMap(t *testing.T) {
	ca1, ca2 := newTestCA(t), newTestCA(t)
	kube := kubefake.NewClientset()
	cms := kube.CoreV1().ConfigMaps(ClientCANamespace)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := NewClusterClientCA(kube, ClientCANamespace, ClientCAConfigMap, logrus.New())
	go watched.Run(ctx)

	verifies := func(cert *x509.Certificate) func() bool {
		return func() bool {
			opts, ok := watched.VerifyOptions()
			if !ok {
				return false
			}
			_, err := cert.Verify(opts)
			return err == nil
		}
	}
	known := func() bool { _, ok := watched.VerifyOptions(); return ok }
	assert.False(t, known(), "no CA before the ConfigMap")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ClientCAConfigMap, Namespace: ClientCANamespace},
		Data: map[string]string{clientCAKey: ca1.pem()}}
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, verifies(ca1.client(t, "alice")), 5*time.Second, 10*time.Millisecond)

	cm.Data[clientCAKey] = ca2.pem()
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, verifies(ca2.client(t, "alice")), 5*time.Second, 10*time.Millisecond)
	assert.False(t, verifies(ca1.client(t, "alice"))(), "the old CA is no longer trusted")

	cm.Data[clientCAKey] = "not a certificate"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !known() }, 5*time.Second, 10*time.Millisecond)
}

// A request without an Authorization header is its client certificate's
// user when the certificate verifies against the cluster's client CA: the
// common name, its organizations as groups and system:authenticated. A
// certificate of another CA is a 401; a bearer token wins over a
// certificate; without a known CA a certificate is refused.
func TestKubeAuthTakesClientCertificates(t *testing.T) {
	cluster, other := newTestCA(t), newTestCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(cluster.cert)
	caKnown := true
	verify := func() (x509.VerifyOptions, bool) {
		return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, caKnown
	}
	a := NewKubeAuth(newFakeKube()).WithClientCertificates(verify)
	withCert := func(cert *x509.Certificate, header string) *http.Request {
		r := requestWith(header)
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
		return r
	}
	ctx := context.Background()

	u, err := a.Authenticate(ctx, withCert(cluster.client(t, "bob", "strata-operators"), ""))
	require.NoError(t, err)
	assert.Equal(t, "bob", u.GetName())
	assert.Equal(t, []string{"strata-operators", "system:authenticated"}, u.GetGroups())

	_, err = a.Authenticate(ctx, withCert(other.client(t, "mallory", "system:masters"), ""))
	assert.True(t, errors.Is(err, ErrUnauthenticated), "%v", err)
	assert.ErrorContains(t, err, `"mallory"`)

	u, err = a.Authenticate(ctx, withCert(cluster.client(t, "bob"), "Bearer good"))
	require.NoError(t, err)
	assert.Equal(t, alice.Username, u.GetName(), "the token names the user")

	caKnown = false
	_, err = a.Authenticate(ctx, withCert(cluster.client(t, "bob"), ""))
	assert.True(t, errors.Is(err, ErrUnauthenticated), "%v", err)
	assert.ErrorContains(t, err, "client CA is unknown")

	_, err = NewKubeAuth(newFakeKube()).Authenticate(ctx, withCert(cluster.client(t, "bob"), ""))
	assert.ErrorContains(t, err, "no Authorization header", "tokens only without WithClientCertificates")
}

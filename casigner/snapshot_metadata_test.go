package casigner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"testing"
	"time"

	smsv1beta1 "github.com/kubernetes-csi/external-snapshot-metadata/client/apis/snapshotmetadataservice/v1beta1"
	smsfake "github.com/kubernetes-csi/external-snapshot-metadata/client/clientset/versioned/fake"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/strata-storage/strata/types"
)

// metadataFake records the CRs applied; the generated fake cannot apply.
type metadataFake struct {
	*smsfake.Clientset
	applied []smsv1beta1.SnapshotMetadataService
	missing bool // answer as if the CRD were not installed
}

func newMetadataFake() *metadataFake {
	f := &metadataFake{Clientset: smsfake.NewSimpleClientset()}
	f.PrependReactor("patch", "snapshotmetadataservices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if f.missing {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "cbt.storage.k8s.io",
				Resource: "snapshotmetadataservices"}, a.(k8stesting.PatchAction).GetName())
		}
		var sms smsv1beta1.SnapshotMetadataService
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &sms); err != nil {
			return true, nil, err
		}
		f.applied = append(f.applied, sms)
		return true, &sms, nil
	})
	return f
}

func newMetadataServer(t *testing.T, kube *fake.Clientset, clk *clocktesting.FakeClock, sms *metadataFake) *Server {
	t.Helper()
	s, err := New(quietLog(), kube, Options{Namespace: ns, Identity: "signer-1", CARotateBefore: 30 * day,
		LeaseDuration: 3 * time.Second, Clock: clk,
		SnapshotMetadata: &SnapshotMetadataOptions{Address: "127.0.0.1:6443", Audience: "backups", Client: sms}})
	require.NoError(t, err)
	startSecretCache(t, s)
	return s
}

// metadataSecretCert is the sidecar's certificate, checked against the
// CR's bundle for the names backup tools dial: the CR's address and the Service.
func metadataSecretCert(t *testing.T, kube *fake.Clientset, cr smsv1beta1.SnapshotMetadataService) *x509.Certificate {
	t.Helper()
	secret, err := kube.CoreV1().Secrets(ns).Get(context.Background(), SnapshotMetadataSecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.SecretTypeTLS, secret.Type)
	pair, err := tls.X509KeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	require.NoError(t, err, "the sidecar loads tls.crt and tls.key")
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(cr.Spec.CACert))
	address, _, err := net.SplitHostPort(cr.Spec.Address)
	require.NoError(t, err)
	for _, host := range []string{address, "strata-snapshot-metadata.strata-system", "strata-snapshot-metadata.strata-system.svc"} {
		_, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, CurrentTime: pair.Leaf.NotBefore.Add(time.Hour)})
		assert.NoError(t, err, "a backup tool dialing %s trusts it", host)
	}
	assert.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, pair.Leaf.ExtKeyUsage, "it cannot act as a Strata client")
	return pair.Leaf
}

func TestLeaderPublishesTheSnapshotMetadataService(t *testing.T) {
	kube := fake.NewClientset()
	clk := clocktesting.NewFakeClock(t0)
	sms := newMetadataFake()
	s := newMetadataServer(t, kube, clk, sms)
	ctx := context.Background()
	st := &leaderState{}
	pass := func() time.Duration {
		t.Helper()
		next, err := s.reconcile(ctx, st)
		require.NoError(t, err)
		return next
	}

	assert.Equal(t, resync, pass())
	require.Len(t, sms.applied, 1)
	cr := sms.applied[0]
	assert.Equal(t, types.CSIDriverName, cr.Name, "backup tools look it up by the driver's name")
	assert.Equal(t, "127.0.0.1:6443", cr.Spec.Address)
	assert.Equal(t, "backups", cr.Spec.Audience)
	first := metadataSecretCert(t, kube, cr)

	kube.ClearActions()
	pass()
	assert.Len(t, sms.applied, 1, "an unchanged pass applies nothing")
	assert.Empty(t, kube.Actions(), "and reads nothing")

	// A new leader finds the certificate in the Secret and keeps it.
	st = &leaderState{}
	pass()
	assert.True(t, first.Equal(metadataSecretCert(t, kube, cr)), "a new leader keeps a valid certificate")

	// Two thirds into its life it is replaced.
	clk.Step(servingValidity * 2 / 3)
	pass()
	renewed := metadataSecretCert(t, kube, sms.applied[len(sms.applied)-1])
	assert.False(t, first.Equal(renewed), "renewed when due")
	assert.True(t, renewed.NotAfter.After(first.NotAfter))
}

func TestLeaderReissuesTheSidecarCertificateForANewAddress(t *testing.T) {
	kube := fake.NewClientset()
	clk := clocktesting.NewFakeClock(t0)
	sms := newMetadataFake()
	s := newMetadataServer(t, kube, clk, sms)
	_, err := s.reconcile(context.Background(), &leaderState{})
	require.NoError(t, err)

	s.opts.SnapshotMetadata.Address = "metadata.example.com:443" // the manager restarted with a new flag
	_, err = s.reconcile(context.Background(), &leaderState{})
	require.NoError(t, err)
	require.Len(t, sms.applied, 2)
	assert.Equal(t, "metadata.example.com:443", sms.applied[1].Spec.Address)
	leaf := metadataSecretCert(t, kube, sms.applied[1])
	assert.Error(t, leaf.VerifyHostname("127.0.0.1"), "the old address is not named any more")
}

// Without the CRD the signer still works: the leader says why once and
// publishes when the CRD appears.
func TestLeaderWithoutTheSnapshotMetadataCRD(t *testing.T) {
	kube := fake.NewClientset()
	sms := newMetadataFake()
	sms.missing = true
	s := newMetadataServer(t, kube, clocktesting.NewFakeClock(t0), sms)
	st := &leaderState{}
	next, err := s.reconcile(context.Background(), st)
	require.NoError(t, err, "the CA does not wait for it")
	assert.Equal(t, resync, next)
	assert.True(t, st.metadata.missing)

	sms.missing = false
	_, err = s.reconcile(context.Background(), st)
	require.NoError(t, err)
	assert.Len(t, sms.applied, 1)
	assert.False(t, st.metadata.missing)
}

func TestSnapshotMetadataOptionsAreChecked(t *testing.T) {
	kube := fake.NewClientset()
	tests := []struct {
		address, audience, wantErr string
	}{
		{"metadata", "a", `--snapshot-metadata-address "metadata": want host:port, the address backup tools dial`},
		{":443", "a", `--snapshot-metadata-address ":443": want host:port, the address backup tools dial`},
		{"h:0", "a", `--snapshot-metadata-address "h:0": port "0" is not between 1 and 65535`},
		{"h:443", "", "--snapshot-metadata-audience: empty; the sidecar needs an audience to check tokens against"},
	}
	for _, tc := range tests {
		t.Run(tc.address+"/"+tc.audience, func(t *testing.T) {
			_, err := New(quietLog(), kube, Options{Namespace: ns, Identity: "n",
				CARotateBefore: 30 * day, LeaseDuration: time.Second, SnapshotMetadata: &SnapshotMetadataOptions{
					Address: tc.address, Audience: tc.audience, Client: newMetadataFake()}})
			assert.EqualError(t, err, tc.wantErr)
		})
	}
}

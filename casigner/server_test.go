package casigner

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/types"
)

const ns = types.DefaultNamespace

func quietLog() logrus.FieldLogger {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	return log
}

func newTestSigner(t *testing.T, kube *fake.Clientset, clk *clocktesting.FakeClock) *Server {
	t.Helper()
	s, err := New(quietLog(), kube, Options{Namespace: ns, Identity: "signer-1", CARotateBefore: 30 * day,
		LeaseDuration: 3 * time.Second, Clock: clk})
	require.NoError(t, err)
	startSecretCache(t, s)
	return s
}

// startSecretCache runs the signer's CA Secret informer, as Run does.
func startSecretCache(t *testing.T, s *Server) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s.factory.Start(ctx.Done())
	require.True(t, cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced))
}

func TestOptionsAreChecked(t *testing.T) {
	good := Options{Namespace: ns, Identity: "n", CARotateBefore: 30 * day, LeaseDuration: time.Second}
	tests := []struct {
		name    string
		edit    func(*Options)
		wantErr string
	}{
		{"rotate before longer than half the CA's life", func(o *Options) { o.CARotateBefore = 200 * day },
			"--ca-rotate-before: 4800h0m0s is not between 0 and 4380h0m0s, half the CA's validity"},
		{"no rotation", func(o *Options) { o.CARotateBefore = 0 },
			"--ca-rotate-before: 0s is not between 0 and 4380h0m0s, half the CA's validity"},
		{"no identity", func(o *Options) { o.Identity = "" }, "ca-signer: --namespace and --identity are required"},
		{"short lease", func(o *Options) { o.LeaseDuration = time.Millisecond }, "--lease-duration: 1ms is shorter than 1s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			_, err := New(quietLog(), fake.NewClientset(), o)
			assert.EqualError(t, err, tc.wantErr)
		})
	}
}

// webhookConfigurations are the chart's, filled as the webhook leader
// fills them: caBundle is what the API server trusts.
func webhookConfigurations(caBundle []byte) []runtime.Object {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: caBundle}
	return []runtime.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: types.MutatorConfigName},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "m.strata.io", ClientConfig: cc}}},
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: types.ValidatorConfigName},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "v.strata.io", ClientConfig: cc}}},
	}
}

// applyBundle does what the webhook leader does on the trust's change.
func applyBundle(t *testing.T, kube *fake.Clientset, bundle []byte) {
	t.Helper()
	ctx := context.Background()
	vc, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, types.ValidatorConfigName, metav1.GetOptions{})
	require.NoError(t, err)
	vc.Webhooks[0].ClientConfig.CABundle = bundle
	_, err = kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, vc, metav1.UpdateOptions{})
	require.NoError(t, err)
	mc, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, types.MutatorConfigName, metav1.GetOptions{})
	require.NoError(t, err)
	mc.Webhooks[0].ClientConfig.CABundle = bundle
	_, err = kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mc, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// The leader creates the CA, publishes the trust, rotates in three phases
// and promotes the next CA only once the webhook configurations trust it.
func TestLeaderRotatesTheCA(t *testing.T) {
	kube := fake.NewClientset(webhookConfigurations(nil)...)
	clk := clocktesting.NewFakeClock(t0)
	s := newTestSigner(t, kube, clk)
	ctx := context.Background()
	st := &leaderState{}
	pass := func() time.Duration {
		t.Helper()
		next, err := s.reconcile(ctx, st)
		require.NoError(t, err)
		return next
	}
	current := func() *pki.CAState {
		t.Helper()
		secret, err := kube.CoreV1().Secrets(ns).Get(ctx, pki.CASecretName, metav1.GetOptions{})
		require.NoError(t, err)
		state, err := pki.ParseCAState(secret.Data)
		require.NoError(t, err)
		require.Eventually(t, func() bool { // the informer catches up, as the next pass would see it
			cached, err := s.secrets.Get(pki.CASecretName)
			return err == nil && reflect.DeepEqual(cached.Data, secret.Data)
		}, 5*time.Second, 10*time.Millisecond)
		return state
	}
	published := func() *pki.Trust {
		t.Helper()
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
		require.NoError(t, err)
		trust, err := pki.ParseTrust(cm.Data)
		require.NoError(t, err)
		return trust
	}

	assert.Equal(t, resync, pass(), "the first pass creates the CA and publishes it")
	first := current()
	assert.True(t, published().Signing.Equal(first.Current.Cert))
	applyBundle(t, kube, first.BundlePEM())

	clk.SetTime(first.Current.Cert.NotAfter.Add(-30 * day))
	assert.Equal(t, retryWait, pass(), "phase 1 writes the Secret")
	rotating := current()
	require.NotNil(t, rotating.Next)
	assert.Equal(t, retryWait, pass(), "the trust is published; promotion waits for the configurations")
	assert.Len(t, published().Bundle, 2)
	assert.True(t, published().Signing.Equal(first.Current.Cert), "the old CA signs until promotion")
	clk.Step(time.Hour)
	assert.Equal(t, retryWait, pass(), "still not in the configurations: no promotion, however long")

	applyBundle(t, kube, rotating.BundlePEM())
	assert.Equal(t, promoteAfter, pass(), "the configurations trust it: promotion waits for the API server to load it")
	clk.Step(promoteAfter)
	assert.Equal(t, retryWait, pass(), "phase 2 writes the Secret")
	promoted := current()
	assert.Nil(t, promoted.Next)
	assert.True(t, promoted.Current.Cert.Equal(rotating.Next.Cert))
	assert.Len(t, promoted.Bundle, 2, "the old CA stays trusted while every component asks again")
	assert.Equal(t, retireAfter, pass(), "phase 3 waits for every component to be signed anew")
	assert.True(t, published().Signing.Equal(promoted.Current.Cert))

	clk.Step(retireAfter)
	assert.Equal(t, retryWait, pass(), "phase 3 writes the Secret")
	retired := current()
	require.Len(t, retired.Bundle, 1, "the old CA is retired")
	assert.Equal(t, resync, pass())
	assert.Equal(t, retired.BundlePEM(), published().BundlePEM(), "everyone stops trusting the old CA")
}

// An admin asks for a rotation with an annotation; the leader starts phase
// 1 at once and removes the annotation.
func TestLeaderRotatesTheCAWhenAsked(t *testing.T) {
	kube := fake.NewClientset()
	s := newTestSigner(t, kube, clocktesting.NewFakeClock(t0))
	ctx := context.Background()
	st := &leaderState{}
	_, err := s.reconcile(ctx, st)
	require.NoError(t, err)
	secret, err := kube.CoreV1().Secrets(ns).Get(ctx, pki.CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	first, err := pki.ParseCAState(secret.Data)
	require.NoError(t, err)
	secret.Annotations = map[string]string{pki.AnnotationRotateCA: "now"}
	_, err = kube.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cached, err := s.secrets.Get(pki.CASecretName)
		return err == nil && cached.Annotations[pki.AnnotationRotateCA] != ""
	}, 5*time.Second, 10*time.Millisecond)

	next, err := s.reconcile(ctx, st)
	require.NoError(t, err)
	assert.Equal(t, retryWait, next)
	secret, err = kube.CoreV1().Secrets(ns).Get(ctx, pki.CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, secret.Annotations, pki.AnnotationRotateCA, "the request is consumed")
	rotating, err := pki.ParseCAState(secret.Data)
	require.NoError(t, err)
	require.NotNil(t, rotating.Next, "phase 1 began")
	assert.True(t, rotating.Current.Cert.Equal(first.Current.Cert), "the current CA still signs until promotion")
}

func TestLeaderReplacesAnUnusableSecret(t *testing.T) {
	broken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: pki.CASecretName, Namespace: ns},
		Data: map[string][]byte{pki.KeyCACert: []byte("garbage")}}
	kube := fake.NewClientset(broken)
	s := newTestSigner(t, kube, clocktesting.NewFakeClock(t0))
	_, err := s.reconcile(context.Background(), &leaderState{})
	require.NoError(t, err)
	secret, err := kube.CoreV1().Secrets(ns).Get(context.Background(), pki.CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	_, err = pki.ParseCAState(secret.Data)
	assert.NoError(t, err)
}

// The policy the signer judges with: the managers' ServiceAccount, the
// chart's Services' names for a manager.
func TestPolicy(t *testing.T) {
	s := newTestSigner(t, fake.NewClientset(), clocktesting.NewFakeClock(t0))
	p := s.policy()
	assert.Equal(t, "system:serviceaccount:strata-system:strata-manager", p.Requester)
	assert.Contains(t, p.ManagerDNSNames, "strata-api.strata-system.svc")
	assert.Contains(t, p.ManagerDNSNames, "strata-webhook.strata-system.svc.cluster.local")
}

package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/admission/admissiontest"
	"github.com/strata-storage/strata/webhook/resources/volume"
)

const ns = types.DefaultNamespace

func threeNodes() []runtime.Object {
	var objs []runtime.Object
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		objs = append(objs, &v1beta1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns}})
	}
	return objs
}

func quietLog() logrus.FieldLogger {
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	return log
}

func newTestServer(t *testing.T, env *dstest.Env, urlHost string, clk clock.Clock) *Server {
	t.Helper()
	s, err := New(quietLog(), env.DS, env.Kube, Options{Namespace: ns, Identity: "node-1", Listen: "127.0.0.1:0",
		URLHost: urlHost, CARotateBefore: 30 * day, LeaseDuration: 3 * time.Second, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.ln.Close() })
	return s
}

// startSecretCache runs the server's CA Secret informer, as Run does.
func startSecretCache(t *testing.T, s *Server) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s.factory.Start(ctx.Done())
	require.True(t, cache.WaitForCacheSync(ctx.Done(), s.secretInformer.HasSynced))
}

func TestOptionsAreChecked(t *testing.T) {
	env := dstest.New(t, nil, nil)
	good := Options{Namespace: ns, Identity: "n", Listen: "127.0.0.1:0", CARotateBefore: 30 * day, LeaseDuration: time.Second}
	tests := []struct {
		name    string
		edit    func(*Options)
		wantErr string
	}{
		{"rotate before longer than half the CA's life", func(o *Options) { o.CARotateBefore = 200 * day },
			"--webhook-ca-rotate-before: 4800h0m0s is not between 0 and 4380h0m0s, half the CA's validity"},
		{"no rotation", func(o *Options) { o.CARotateBefore = 0 },
			"--webhook-ca-rotate-before: 0s is not between 0 and 4380h0m0s, half the CA's validity"},
		{"listen without a port", func(o *Options) { o.Listen = "127.0.0.1" },
			`--webhook-listen "127.0.0.1": address 127.0.0.1: missing port in address`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			_, err := New(quietLog(), env.DS, env.Kube, o)
			assert.EqualError(t, err, tc.wantErr)
		})
	}
}

func TestLeaderAppliesConfigurations(t *testing.T) {
	for _, mode := range []string{"local", "package"} {
		t.Run(mode, func(t *testing.T) {
			env := dstest.New(t, nil, nil)
			urlHost := ""
			if mode == "local" {
				urlHost = "127.0.0.1"
			}
			clk := clocktesting.NewFakeClock(dstest.Now)
			s := newTestServer(t, env, urlHost, clk)
			startSecretCache(t, s)
			ctx := context.Background()

			next, err := s.reconcileAsLeader(ctx, &leaderState{})
			require.NoError(t, err)
			assert.Equal(t, leaderResync, next)

			secret, err := env.Kube.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
			require.NoError(t, err, "the first pass creates the CA Secret")
			bundle := secret.Data[pki.KeyBundle]
			require.NotEmpty(t, bundle)

			mc, err := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, MutatorConfigName, metav1.GetOptions{})
			require.NoError(t, err)
			vc, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, ValidatorConfigName, metav1.GetOptions{})
			require.NoError(t, err)
			require.Len(t, mc.Webhooks, 1)
			require.Len(t, vc.Webhooks, 1)
			m, v := mc.Webhooks[0], vc.Webhooks[0]

			port := strconv.Itoa(s.Addr().(*net.TCPAddr).Port)
			for _, c := range []struct {
				path string
				cc   admissionregistrationv1.WebhookClientConfig
			}{{admission.MutatePath, m.ClientConfig}, {admission.ValidatePath, v.ClientConfig}} {
				assert.Equal(t, bundle, c.cc.CABundle)
				if mode == "local" {
					require.NotNil(t, c.cc.URL)
					assert.Equal(t, "https://127.0.0.1:"+port+c.path, *c.cc.URL)
					assert.Nil(t, c.cc.Service)
				} else {
					assert.Nil(t, c.cc.URL)
					require.NotNil(t, c.cc.Service)
					assert.Equal(t, admissionregistrationv1.ServiceReference{Namespace: ns, Name: ServiceName,
						Path: &c.path, Port: ptr.To(int32(ServicePort))}, *c.cc.Service)
				}
			}
			wantRules := []admissionregistrationv1.RuleWithOperations{
				{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"}, Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"strata.io"}, APIVersions: []string{"v1beta1"}, Resources: []string{"snapshots"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope)}},
				{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"}, Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"strata.io"}, APIVersions: []string{"v1beta1"}, Resources: []string{"volumeattachments"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope)}},
				{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"}, Rule: admissionregistrationv1.Rule{
					APIGroups: []string{"strata.io"}, APIVersions: []string{"v1beta1"}, Resources: []string{"volumes"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope)}},
			}
			assert.Equal(t, wantRules, m.Rules)
			// Deleting a volume is judged too (one a workload holds is
			// refused), and backing images are only validated, deletes too
			// (one a volume uses is refused); resource quotas are only
			// validated.
			wantRules[2].Operations = append(wantRules[2].Operations, "DELETE")
			wantRules = append([]admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE", "DELETE"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"strata.io"}, APIVersions: []string{"v1beta1"},
					Resources: []string{"backingimages"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}, {
				Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"strata.io"}, APIVersions: []string{"v1beta1"},
					Resources: []string{"recurringjobs"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}, {
				Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"strata.io"}, APIVersions: []string{"v1beta1"},
					Resources: []string{"resourcequotas"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}}, wantRules...)
			// SnapshotGroups, VolumeGroupSnapshots and VolumeSnapshots are
			// judged on creation only (a group's spec is immutable; the
			// others against the snapshot quota); without KubeVirt and
			// Harvester installed, their kinds have no rule. Rules come in
			// the order of their resources' names.
			createOnly := func(group, version, resource string) admissionregistrationv1.RuleWithOperations {
				return admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version},
						Resources: []string{resource}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}
			}
			wantRules = slices.Concat(wantRules[:3], []admissionregistrationv1.RuleWithOperations{
				createOnly("strata.io", "v1beta1", "snapshotgroups")}, wantRules[3:5], []admissionregistrationv1.RuleWithOperations{
				createOnly("groupsnapshot.storage.k8s.io", "v1", "volumegroupsnapshots")}, wantRules[5:],
				[]admissionregistrationv1.RuleWithOperations{createOnly("snapshot.storage.k8s.io", "v1", "volumesnapshots")})
			assert.Equal(t, wantRules, v.Rules)
			assert.Equal(t, admissionregistrationv1.Fail, *m.FailurePolicy)
			assert.Equal(t, admissionregistrationv1.Fail, *v.FailurePolicy)
			assert.Equal(t, admissionregistrationv1.SideEffectClassNone, *v.SideEffects)
			assert.Equal(t, admissionregistrationv1.Equivalent, *v.MatchPolicy)
			assert.EqualValues(t, 5, *v.TimeoutSeconds)
			assert.EqualValues(t, 5, *m.TimeoutSeconds)

			// A second pass with nothing new writes nothing.
			env.ClearActions()
			st := &leaderState{applied: nil}
			_, err = s.reconcileAsLeader(ctx, st)
			require.NoError(t, err)
			env.ClearActions()
			_, err = s.reconcileAsLeader(ctx, st)
			require.NoError(t, err)
			assert.Empty(t, env.Kube.Actions(), "an unchanged pass makes no API call")
		})
	}
}

// The leader rotates the CA in two passes and keeps the old CA in the
// configurations' bundle.
func TestLeaderRotatesTheCA(t *testing.T) {
	env := dstest.New(t, nil, nil)
	clk := clocktesting.NewFakeClock(dstest.Now)
	s := newTestServer(t, env, "127.0.0.1", clk)
	startSecretCache(t, s)
	ctx := context.Background()
	st := &leaderState{}
	pass := func() time.Duration {
		t.Helper()
		next, err := s.reconcileAsLeader(ctx, st)
		require.NoError(t, err)
		return next
	}
	current := func() *pki.CAState {
		t.Helper()
		secret, err := env.Kube.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
		require.NoError(t, err)
		state, err := pki.ParseCAState(secret.Data)
		require.NoError(t, err)
		// Let the informer catch up, as the next pass would.
		require.Eventually(t, func() bool {
			cached, err := s.secrets.Get(CASecretName)
			return err == nil && reflect.DeepEqual(cached.Data, secret.Data) // the fake sets no resourceVersion
		}, 5*time.Second, 10*time.Millisecond)
		return state
	}
	bundleInConfig := func() []byte {
		t.Helper()
		vc, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, ValidatorConfigName, metav1.GetOptions{})
		require.NoError(t, err)
		return vc.Webhooks[0].ClientConfig.CABundle
	}

	pass()
	first := current()

	clk.SetTime(first.Current.Cert.NotAfter.Add(-30 * day))
	assert.Equal(t, retryWait, pass(), "phase 1 writes the Secret")
	rotating := current()
	require.NotNil(t, rotating.Next)
	assert.True(t, rotating.Current.Cert.Equal(first.Current.Cert))

	wait := pass()
	assert.Equal(t, promoteAfter, wait, "the new bundle is applied; promotion waits for the API server to load it")
	assert.Equal(t, rotating.BundlePEM(), bundleInConfig())

	clk.Step(promoteAfter)
	assert.Equal(t, retryWait, pass(), "phase 2 writes the Secret")
	promoted := current()
	assert.Nil(t, promoted.Next)
	assert.True(t, promoted.Current.Cert.Equal(rotating.Next.Cert))
	assert.Len(t, promoted.Bundle, 2, "the old CA stays trusted while every component re-issues")

	assert.Equal(t, retireAfter, pass(), "phase 3 waits for every component to re-issue")
	assert.Equal(t, promoted.BundlePEM(), bundleInConfig())

	clk.Step(retireAfter)
	assert.Equal(t, retryWait, pass(), "phase 3 writes the Secret")
	retired := current()
	require.Len(t, retired.Bundle, 1, "the old CA is retired")
	assert.True(t, retired.Bundle[0].Equal(promoted.Current.Cert))
	assert.Equal(t, leaderResync, pass())
	assert.Equal(t, retired.BundlePEM(), bundleInConfig(), "the API server no longer trusts the old CA")
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(ctx, types.CABundleConfigMap, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, string(retired.BundlePEM()), cm.Data[types.CABundleKey], "users' tools see the same bundle")
}

// An admin asks for a rotation with an annotation; the leader starts phase
// 1 at once and removes the annotation.
func TestLeaderRotatesTheCAWhenAsked(t *testing.T) {
	env := dstest.New(t, nil, nil)
	clk := clocktesting.NewFakeClock(dstest.Now)
	s := newTestServer(t, env, "127.0.0.1", clk)
	startSecretCache(t, s)
	ctx := context.Background()
	st := &leaderState{}
	_, err := s.reconcileAsLeader(ctx, st)
	require.NoError(t, err)
	secret, err := env.Kube.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	first, err := pki.ParseCAState(secret.Data)
	require.NoError(t, err)
	secret.Annotations = map[string]string{pki.AnnotationRotateCA: "now"}
	_, err = env.Kube.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cached, err := s.secrets.Get(CASecretName)
		return err == nil && cached.Annotations[pki.AnnotationRotateCA] != ""
	}, 5*time.Second, 10*time.Millisecond)

	next, err := s.reconcileAsLeader(ctx, st)
	require.NoError(t, err)
	assert.Equal(t, retryWait, next)
	secret, err = env.Kube.CoreV1().Secrets(ns).Get(ctx, CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, secret.Annotations, pki.AnnotationRotateCA, "the request is consumed")
	rotating, err := pki.ParseCAState(secret.Data)
	require.NoError(t, err)
	require.NotNil(t, rotating.Next, "phase 1 began")
	assert.True(t, rotating.Current.Cert.Equal(first.Current.Cert), "the current CA still signs until promotion")
	assert.Len(t, rotating.Bundle, 2)
}

func TestLeaderReplacesAnUnusableSecret(t *testing.T) {
	broken := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: CASecretName, Namespace: ns},
		Data: map[string][]byte{pki.KeyCACert: []byte("garbage")}}
	env := dstest.New(t, nil, []runtime.Object{broken})
	s := newTestServer(t, env, "127.0.0.1", clocktesting.NewFakeClock(dstest.Now))
	startSecretCache(t, s)
	_, err := s.reconcileAsLeader(context.Background(), &leaderState{})
	require.NoError(t, err)
	secret, err := env.Kube.CoreV1().Secrets(ns).Get(context.Background(), CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	_, err = pki.ParseCAState(secret.Data)
	assert.NoError(t, err)
}

// The whole server: it creates the CA, serves HTTPS with a certificate the
// configurations' bundle trusts, wins the election and writes the
// configurations, and answers AdmissionReviews.
func TestServerRoundTrip(t *testing.T) {
	env := dstest.New(t, threeNodes(), nil)
	s := newTestServer(t, env, "127.0.0.1", clock.RealClock{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		assert.NoError(t, <-done)
	}()

	var cfg *admissionregistrationv1.ValidatingWebhookConfiguration
	require.Eventually(t, func() bool {
		var err error
		cfg, err = env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, ValidatorConfigName, metav1.GetOptions{})
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the leader writes the configurations")
	cc := cfg.Webhooks[0].ClientConfig
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(cc.CABundle))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		Timeout: 5 * time.Second}

	review := func(url string, obj *v1beta1.Volume) *admissionv1.AdmissionResponse {
		t.Helper()
		body, err := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request:  admissiontest.Request(volume.Resource, admissiontest.Admin, nil, obj)})
		require.NoError(t, err)
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		require.NoError(t, err, "the served certificate is trusted by the caBundle for the URL's host")
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var out admissionv1.AdmissionReview
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		assert.EqualValues(t, "req-"+obj.Name, out.Response.UID)
		return out.Response
	}
	vol := func(name string, replicas int32) *v1beta1.Volume {
		return &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1beta1.VolumeSpec{Size: resource.MustParse("1Gi"), NumberOfReplicas: replicas}}
	}

	resp := review(*cc.URL, vol("too-many", 4))
	assert.False(t, resp.Allowed)
	assert.Equal(t, "spec.numberOfReplicas: 4 is more than the 3 nodes in the cluster; each replica needs a node of its own",
		resp.Result.Message)
	assert.True(t, review(*cc.URL, vol("fine", 3)).Allowed)

	mc, err := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, MutatorConfigName, metav1.GetOptions{})
	require.NoError(t, err)
	resp = review(*mc.Webhooks[0].ClientConfig.URL, vol("defaults", 0))
	require.True(t, resp.Allowed)
	assert.JSONEq(t, `[{"op":"add","path":"/metadata/finalizers","value":["strata.io/cleanup"]},
		{"op":"add","path":"/spec/frontend","value":"nbd"},
		{"op":"add","path":"/spec/numberOfReplicas","value":3},
		{"op":"add","path":"/spec/snapshotMaxCount","value":250}]`, admissiontest.SortedPatch(t, resp.Patch))

	lease, err := env.Kube.CoordinationV1().Leases(ns).Get(ctx, LeaderLeaseName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "node-1", *lease.Spec.HolderIdentity)
	assert.Equal(t, fmt.Sprintf("https://127.0.0.1:%d/v1/validate", s.Addr().(*net.TCPAddr).Port), *cc.URL)
}

func TestLeaderTimings(t *testing.T) {
	for _, d := range []time.Duration{time.Second, 3 * time.Second, 20 * time.Second} {
		lease, renew, retry := leaderTimings(d)
		assert.Equal(t, d, lease)
		assert.Less(t, renew, lease)
		assert.Less(t, time.Duration(float64(retry)*1.2), renew, "client-go's constraint")
	}
}

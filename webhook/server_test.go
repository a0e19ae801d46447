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
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// testCertificates are what a manager's keeper holds for its webhook: a
// serving certificate signed by a CA, and the trust the signer published.
func testCertificates(t *testing.T) (*pki.MemorySource, *pki.Trust) {
	t.Helper()
	ca, err := pki.NewAuthority()
	require.NoError(t, err)
	c, err := pki.IssueIdentity(ca.State.Current, pki.Identity{Component: pki.ComponentManager, Node: "node-1"},
		ServingHosts(ns, "127.0.0.1"), time.Now())
	require.NoError(t, err)
	var serving pki.MemorySource
	serving.Set(c, ca.State.Bundle)
	return &serving, ca.State.Trust()
}

func newTestServer(t *testing.T, env *dstest.Env, urlHost string, clk clock.Clock) *Server {
	t.Helper()
	serving, trust := testCertificates(t)
	s, err := New(quietLog(), env.DS, env.Kube, Options{Namespace: ns, Identity: "node-1", Listen: "127.0.0.1:0",
		URLHost: urlHost, Serving: serving, Trust: func() *pki.Trust { return trust }, LeaseDuration: 3 * time.Second, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.ln.Close() })
	return s
}

func TestOptionsAreChecked(t *testing.T) {
	env := dstest.New(t, nil, nil)
	serving, trust := testCertificates(t)
	good := Options{Namespace: ns, Identity: "n", Listen: "127.0.0.1:0", Serving: serving,
		Trust: func() *pki.Trust { return trust }, LeaseDuration: time.Second}
	tests := []struct {
		name    string
		edit    func(*Options)
		wantErr string
	}{
		{"no certificates", func(o *Options) { o.Serving = nil },
			"webhook: no certificates (the keeper's serving certificate and trust)"},
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
			ctx := context.Background()

			next, err := s.reconcileAsLeader(ctx, &leaderState{})
			require.NoError(t, err)
			assert.Equal(t, leaderResync, next)
			bundle := s.opts.Trust().BundlePEM()

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

package pki

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/strata-storage/strata/types"
)

// fakeAPIServer plays the API server and the signer for the keeper's
// requests on a fake clientset: it records the requester as a manager Pod's
// token on node would, and lets Handle settle the request.
func fakeAPIServer(ctx context.Context, t *testing.T, kube *fake.Clientset, node string, ca func() (*KeyPair, error)) {
	// The fake generates neither names nor UIDs (the requester waits for
	// its request by both).
	var n atomic.Int32
	kube.PrependReactor("create", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		req := a.(k8stesting.CreateAction).GetObject().(*certificatesv1.CertificateSigningRequest)
		i := n.Add(1)
		if req.Name == "" {
			req.Name = fmt.Sprintf("%s%d", req.GenerateName, i)
		}
		req.UID = k8stypes.UID(fmt.Sprintf("uid-%d", i))
		return false, nil, nil
	})
	// Nor does it filter by field: the requester lists and watches its own.
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	byName := func(sel fields.Selector, obj runtime.Object) bool {
		return sel == nil || sel.Matches(fields.Set{"metadata.name": obj.(metav1.Object).GetName()})
	}
	kube.PrependWatchReactor("certificatesigningrequests", func(a k8stesting.Action) (bool, watch.Interface, error) {
		sel := a.(k8stesting.WatchAction).GetWatchRestrictions().Fields
		w, err := kube.Tracker().Watch(gvr, "")
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) { return e, byName(sel, e.Object) }), nil
	})
	kube.PrependReactor("list", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel := a.(k8stesting.ListAction).GetListRestrictions().Fields
		obj, err := kube.Tracker().List(gvr, certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest"), "")
		if err != nil {
			return true, nil, err
		}
		list := obj.(*certificatesv1.CertificateSigningRequestList)
		list.Items = slices.DeleteFunc(list.Items, func(c certificatesv1.CertificateSigningRequest) bool { return !byName(sel, &c) })
		return true, list, nil
	})
	s := &Signer{Policy: testPolicy, Kube: kube, CA: ca, Now: time.Now}
	// The fake's watch starts from now, not from the list's version: a
	// request is settled a moment after it is seen, once its requester
	// watches it.
	seen := map[string]time.Time{}
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			list, err := kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for i := range list.Items {
				req := list.Items[i].DeepCopy()
				if first, ok := seen[req.Name]; !ok {
					seen[req.Name] = time.Now()
					continue
				} else if time.Since(first) < 100*time.Millisecond {
					continue
				}
				if req.Spec.Username == "" {
					req.Spec.Username, req.Spec.Extra = testRequester, map[string]certificatesv1.ExtraValue{NodeNameExtra: {node}}
					if req, err = kube.CertificatesV1().CertificateSigningRequests().Update(ctx, req, metav1.UpdateOptions{}); err != nil {
						continue
					}
				}
				if err := s.Handle(ctx, req); err != nil && ctx.Err() == nil {
					t.Logf("handling %s: %v", req.Name, err)
				}
			}
		}
	}()
}

func publishTrust(t *testing.T, kube *fake.Clientset, state *CAState) {
	t.Helper()
	cms := kube.CoreV1().ConfigMaps("strata-system")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: types.CABundleConfigMap, Namespace: "strata-system"},
		Data: state.Trust().ConfigMapData()}
	if _, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		_, err = cms.Create(context.Background(), cm, metav1.CreateOptions{})
		require.NoError(t, err)
	}
}

// The keeper holds no CA key: it asks the signer for the manager's, the
// webhook's and the instance manager's certificates, for its own node, and
// asks again once the published trust names a new signing CA.
func TestKeeperAsksTheSigner(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := fake.NewClientset()
	state := newState(t)
	signing := func() (*KeyPair, error) { return state.Current, nil }
	fakeAPIServer(ctx, t, kube, "n1", signing)
	dir := t.TempDir() + "/tls"
	k, err := NewKeeper(logrus.New(), kube, KeeperOptions{Namespace: "strata-system", Node: "n1",
		ManagerHosts: []string{"n1", "strata-api.strata-system.svc"}, WebhookHosts: []string{"127.0.0.1", "localhost"},
		InstanceManagerDir: dir, InstanceManagerHosts: []string{"10.0.0.1"}, RequestTimeout: 10 * time.Second})
	require.NoError(t, err)
	changes := make(chan struct{}, 10)
	k.OnTrustChange(func() { changes <- struct{}{} })
	// Before the signer published its trust: a pass says so and is not ready.
	k.factory.Start(ctx.Done())
	k.factory.WaitForCacheSync(ctx.Done())
	_, err = k.refresh(ctx)
	require.ErrorIs(t, err, ErrNoTrust)
	select {
	case <-k.Ready():
		t.Fatal("ready before the signer published its trust")
	default:
	}
	go k.Run(ctx)
	publishTrust(t, kube, state)
	select {
	case <-k.Ready():
	case <-time.After(20 * time.Second):
		t.Fatal("the keeper got no certificates")
	}
	<-changes
	for _, tc := range []struct {
		src  *MemorySource
		host string
	}{{&k.Manager, "strata-api.strata-system.svc"}, {&k.Webhook, "127.0.0.1"}} {
		c := tc.src.Issued()
		require.NotNil(t, c)
		id, err := IdentityOf(c.TLS.Leaf)
		require.NoError(t, err)
		assert.Equal(t, Identity{Component: ComponentManager, Node: "n1"}, id)
		assert.NoError(t, c.TLS.Leaf.VerifyHostname(tc.host))
		assert.True(t, c.Issuer.Equal(state.Current.Cert))
	}
	im, bundle, err := ReadDir(dir)
	require.NoError(t, err)
	id, err := IdentityOf(im.Leaf)
	require.NoError(t, err)
	assert.Equal(t, Identity{Component: ComponentInstanceManager, Node: "n1"}, id)
	assert.Len(t, bundle, 1)

	// A rotation: the next CA joins the trust (the instance manager's
	// bundle follows), then signs (every certificate is asked for again).
	old := state.Current.Cert
	_, err = state.StartRotation(time.Now())
	require.NoError(t, err)
	next := *state
	publishTrust(t, kube, &next)
	require.Eventually(t, func() bool { _, b, err := ReadDir(dir); return err == nil && len(b) == 2 },
		10*time.Second, 20*time.Millisecond, "the instance manager trusts the next CA before it signs")
	state.Promote(time.Now())
	publishTrust(t, kube, state)
	require.Eventually(t, func() bool {
		im, _, err := ReadDir(dir)
		return err == nil && im.Leaf.CheckSignatureFrom(state.Current.Cert) == nil &&
			k.Manager.Issued().Issuer.Equal(state.Current.Cert) && k.Webhook.Issued().Issuer.Equal(state.Current.Cert)
	}, 20*time.Second, 20*time.Millisecond, "signed anew by the new CA")
	assert.False(t, k.Manager.Issued().Issuer.Equal(old))
	assert.GreaterOrEqual(t, len(changes), 2, "the webhook is told of each change of trust")
}

// A keeper whose requests the signer refuses says why, and has nothing.
func TestKeeperSaysWhyTheSignerRefused(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := fake.NewClientset()
	state := newState(t)
	fakeAPIServer(ctx, t, kube, "n2", func() (*KeyPair, error) { return state.Current, nil }) // a token of another node
	publishTrust(t, kube, state)
	k, err := NewKeeper(logrus.New(), kube, KeeperOptions{Namespace: "strata-system", Node: "n1",
		ManagerHosts: []string{"n1"}, RequestTimeout: 10 * time.Second})
	require.NoError(t, err)
	k.factory.Start(ctx.Done())
	k.factory.WaitForCacheSync(ctx.Done())
	_, err = k.refresh(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "this manager's certificate")
	assert.Contains(t, err.Error(), "strata://manager/n1 is for node n1, the requester's token is bound to node n2")
	assert.Nil(t, k.Manager.Issued())
}

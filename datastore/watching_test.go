package datastore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stratafake "github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned/fake"
)

// A DataStore watching some kinds lists and watches those alone; reads of
// the others fail naming the kind, writes still go through.
func TestNewWatchingWatchesOnlyTheKindsGiven(t *testing.T) {
	strata := stratafake.NewSimpleClientset(&v1beta1.Volume{ObjectMeta: meta("v1")}, &v1beta1.Engine{ObjectMeta: meta("e1")})
	kube := kubefake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "k1"}})
	ds, err := datastore.NewWatching(ns, strata, kube, []schema.GroupResource{v1beta1.Resource("volumes"), corev1.Resource("nodes")})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ds.Start(ctx)
	require.NoError(t, ds.WaitForCacheSync(ctx))

	_, err = ds.Volumes.GetRO("v1")
	assert.NoError(t, err, "a watched kind is cached")
	require.NotNil(t, ds.KubeNodes)
	_, err = ds.KubeNodes.Get("k1")
	assert.NoError(t, err)

	_, err = ds.Engines.GetRO("e1")
	require.Error(t, err)
	assert.False(t, apierrors.IsNotFound(err), "not a silent NotFound")
	assert.Contains(t, err.Error(), "engines.strata.io are not watched")
	_, err = ds.Engines.ListRO(nil)
	assert.ErrorContains(t, err, "not watched")
	_, err = ds.Engines.ListByIndexRO(datastore.IndexByVolume, "v1")
	assert.ErrorContains(t, err, "not watched")
	assert.Nil(t, ds.Engines.Informer())
	assert.Nil(t, ds.PersistentVolumes)
	assert.Nil(t, ds.Leases)

	_, err = ds.Engines.Create(ctx, &v1beta1.Engine{ObjectMeta: meta("e2")})
	assert.NoError(t, err, "writes do not need the cache")

	var listed []string
	for _, a := range append(strata.Actions(), kube.Actions()...) {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			listed = append(listed, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	assert.ElementsMatch(t, []string{"list volumes", "watch volumes", "list nodes", "watch nodes"}, listed)
}

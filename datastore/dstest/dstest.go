// Package dstest builds a DataStore over fake clientsets for unit tests:
// the informers run against the fakes, so controllers under test read
// through the same cache code as in production.
package dstest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/strata-storage/strata/datastore"
	stratafake "github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned/fake"
	"github.com/strata-storage/strata/types"
)

// Env is a started DataStore with its fake clients and clock.
type Env struct {
	DS     *datastore.DataStore
	Strata *stratafake.Clientset
	Kube   *kubefake.Clientset
	Clock  *clocktesting.FakeClock
}

// Now is the fixed start time of every test clock.
var Now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// New starts a DataStore over fakes seeded with the given objects and waits
// for its caches. Informers stop when the test ends.
func New(t *testing.T, strataObjects []runtime.Object, kubeObjects []runtime.Object) *Env {
	t.Helper()
	return newEnv(t, strataObjects, kubeObjects, nil, "")
}

// NewWithInstanceManagerPods is New with the instance managers' Pods and
// revisions watched (datastore.WatchInstanceManagerPods with selector).
func NewWithInstanceManagerPods(t *testing.T, strataObjects []runtime.Object, kubeObjects []runtime.Object,
	selector string) *Env {
	t.Helper()
	return newEnv(t, strataObjects, kubeObjects, nil, selector)
}

// NewWithVMs is New with KubeVirt's and Harvester's kinds installed and the
// given VirtualMachines in the fake API server.
func NewWithVMs(t *testing.T, strataObjects []runtime.Object, kubeObjects []runtime.Object,
	vms ...*unstructured.Unstructured) *Env {
	t.Helper()
	return newEnv(t, strataObjects, kubeObjects, vms, "")
}

func newEnv(t *testing.T, strataObjects []runtime.Object, kubeObjects []runtime.Object, vms []*unstructured.Unstructured,
	imPodSelector string) *Env {
	t.Helper()
	env := &Env{
		Strata: stratafake.NewSimpleClientset(strataObjects...),
		Kube:   kubefake.NewClientset(kubeObjects...),
		Clock:  clocktesting.NewFakeClock(Now),
	}
	ds, err := datastore.New(types.DefaultNamespace, env.Strata, env.Kube)
	require.NoError(t, err)
	ds.Clock = env.Clock
	if vms != nil {
		watchVMs(t, ds, vms)
	}
	if imPodSelector != "" {
		require.NoError(t, ds.WatchInstanceManagerPods(imPodSelector))
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ds.Start(ctx)
	syncCtx, syncCancel := context.WithTimeout(ctx, 10*time.Second)
	defer syncCancel()
	require.NoError(t, ds.WaitForCacheSync(syncCtx))
	if vms != nil {
		require.Eventually(t, ds.OptionalKinds.VirtualMachinesSynced, 10*time.Second, 10*time.Millisecond, "VM cache synced")
	}
	env.DS = ds
	return env
}

// ClearActions forgets the API calls made so far, so a test sees only the
// calls of the step it checks.
func (e *Env) ClearActions() {
	e.Strata.ClearActions()
	e.Kube.ClearActions()
}

// watchVMs installs the optional kinds' CRDs in a fake metadata client and
// serves the VMs from a fake dynamic client.
func watchVMs(t *testing.T, ds *datastore.DataStore, vms []*unstructured.Unstructured) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, metav1.AddMetaToScheme(scheme))
	var crds []runtime.Object
	for _, k := range []datastore.OptionalKind{datastore.KindVirtualMachine, datastore.KindVirtualMachineSnapshot,
		datastore.KindVirtualMachineBackup} {
		crds = append(crds, &metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
			ObjectMeta: metav1.ObjectMeta{Name: k.CRDName()}})
	}
	objs := make([]runtime.Object, len(vms))
	for i, vm := range vms {
		objs[i] = vm
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{datastore.KindVirtualMachine.GroupVersionResource: "VirtualMachineList"}, objs...)
	require.NoError(t, ds.WatchOptionalKinds(metadatafake.NewSimpleMetadataClient(scheme, crds...), dyn))
}

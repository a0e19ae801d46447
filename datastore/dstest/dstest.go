// Package dstest builds a DataStore over fake clientsets for unit tests:
// the informers run against the fakes, so controllers under test read
// through the same cache code as in production.
package dstest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
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
	env := &Env{
		Strata: stratafake.NewSimpleClientset(strataObjects...),
		Kube:   kubefake.NewClientset(kubeObjects...),
		Clock:  clocktesting.NewFakeClock(Now),
	}
	ds, err := datastore.New(types.DefaultNamespace, env.Strata, env.Kube)
	require.NoError(t, err)
	ds.Clock = env.Clock
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ds.Start(ctx)
	syncCtx, syncCancel := context.WithTimeout(ctx, 10*time.Second)
	defer syncCancel()
	require.NoError(t, ds.WaitForCacheSync(syncCtx))
	env.DS = ds
	return env
}

// ClearActions forgets the API calls made so far, so a test sees only the
// calls of the step it checks.
func (e *Env) ClearActions() {
	e.Strata.ClearActions()
	e.Kube.ClearActions()
}

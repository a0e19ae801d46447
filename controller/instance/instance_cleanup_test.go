package instance

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/controller/kit/kittest"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// TestReplicaCleanupWithUnreachableInstanceManager: a deleted replica whose
// instance manager cannot be reached leaves its data (said by an event) and
// lets its CR go; before the first view of the instance manager it waits.
func TestReplicaCleanupWithUnreachableInstanceManager(t *testing.T) {
	tests := []struct {
		name          string
		cache         func() *kit.InstanceCache
		wantErr       bool
		wantFinalizer bool
		wantEvents    []string
	}{
		{name: "stream failed: the CR goes, the data is left", cache: kittest.LostStream, wantEvents: []string{"Warning DataLeftOnNode"}},
		{name: "no stream yet: wait", cache: kit.NewInstanceCache, wantErr: true, wantFinalizer: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			disk := t.TempDir()
			fixture.MkReplicaDirs(t, disk, "r1")
			r := fixture.ReplicaCR("r1", disk, func(r *v1beta1.Replica) { r.DeletionTimestamp = &metav1.Time{Time: dstest.Now} })
			env := dstest.New(t, []runtime.Object{r, fixture.SchedNode("node-1")}, []runtime.Object{fixture.Lease("node-1", 0)})
			rec := record.NewFakeRecorder(10)
			c, err := NewReplicaController(logrus.New(), env.DS, rec, "node-1", "127.0.0.1:1", nil, tc.cache())
			require.NoError(t, err)
			err = c.syncReplica(context.Background(), fixture.NS+"/r1")
			if tc.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			got, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).Get(context.Background(), "r1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantFinalizer, len(got.Finalizers) > 0)
			assert.DirExists(t, filepath.Join(disk, "replicas", "r1"), "data is never deleted without the instance manager")
			fixture.AssertEvents(t, tc.wantEvents, rec)
		})
	}
}

// TestEngineCleanupWithUnreachableInstanceManager: an engine whose instance
// manager cannot be reached lets its CR go only when its volume is going
// too; otherwise (a migration's engine) a stale engine could still write,
// so it waits.
func TestEngineCleanupWithUnreachableInstanceManager(t *testing.T) {
	lost := kittest.LostStream
	deletedEngine := fixture.Engine(func(e *v1beta1.Engine) {
		e.Spec.NodeID = "node-1"
		e.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
	})
	tests := []struct {
		name          string
		volume        *v1beta1.Volume
		cache         func() *kit.InstanceCache
		wantErr       bool
		wantFinalizer bool
	}{
		{name: "volume being deleted: the CR goes", cache: lost,
			volume: fixture.Volume(func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} })},
		{name: "volume gone: the CR goes", cache: lost},
		{name: "volume live (a migration's engine): wait", cache: lost, volume: fixture.Volume(), wantErr: true, wantFinalizer: true},
		{name: "no stream yet: wait", cache: kit.NewInstanceCache, wantErr: true, wantFinalizer: true,
			volume: fixture.Volume(func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{deletedEngine.DeepCopy(), fixture.SchedNode("node-1")}
			if tc.volume != nil {
				objs = append(objs, tc.volume)
			}
			env := dstest.New(t, objs, []runtime.Object{fixture.Lease("node-1", 0)})
			c, err := NewEngineController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", "127.0.0.1:1", nil, tc.cache())
			require.NoError(t, err)
			err = c.syncEngine(context.Background(), fixture.NS+"/v1-e-0")
			if tc.wantErr {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			got, err := env.Strata.StrataV1beta1().Engines(fixture.NS).Get(context.Background(), "v1-e-0", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantFinalizer, len(got.Finalizers) > 0)
		})
	}
}

package instance

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit/kittest"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestReplicaControllerAgainstRealInstanceManager(t *testing.T) {
	im := kittest.StartRealIM(t)
	disk := t.TempDir()
	env := dstest.New(t, []runtime.Object{fixture.ReplicaCR("r1", disk), fixture.SchedNode("node-1")}, []runtime.Object{fixture.Lease("node-1", 0)})
	rec := record.NewFakeRecorder(20)
	c, err := NewReplicaController(logrus.New(), env.DS, rec, "node-1", im.Addr, im.Pool, im.Instances())
	require.NoError(t, err)
	ctx, key := context.Background(), fixture.NS+"/r1"
	get := func() *v1beta1.Replica {
		r, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).Get(ctx, "r1", metav1.GetOptions{})
		require.NoError(t, err)
		return r
	}
	// Wait for the informer to see the last write before the next sync (the
	// fake clientset keeps no resourceVersion to compare).
	syncAfterCache := func() {
		t.Helper()
		want := get()
		require.Eventually(t, func() bool {
			r, err := env.DS.Replicas.GetRO("r1")
			return err == nil && equality.Semantic.DeepEqual(r.Spec, want.Spec) && equality.Semantic.DeepEqual(r.Status, want.Status)
		}, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, c.syncReplica(ctx, key))
	}

	// desire running: the instance is created in the replica's directory.
	require.NoError(t, c.syncReplica(ctx, key))
	im.WaitInstance(t, "r1", true, engineapi.InstanceStateRunning)
	syncAfterCache()
	r := get()
	assert.Equal(t, v1beta1.InstanceStateRunning, r.Status.CurrentState)
	assert.Equal(t, "127.0.0.1", r.Status.IP)
	assert.NotZero(t, r.Status.Port)
	assert.Equal(t, "im-node-1", r.Status.InstanceManagerName)
	assert.True(t, r.Status.Started)
	assert.FileExists(t, filepath.Join(disk, "replicas", "r1", "volume.meta"))

	// desire stopped: the instance goes, the data stays.
	r.Spec.DesireState = v1beta1.InstanceStateStopped
	_, err = env.Strata.StrataV1beta1().Replicas(fixture.NS).Update(ctx, r, metav1.UpdateOptions{})
	require.NoError(t, err)
	syncAfterCache()
	im.WaitInstance(t, "r1", false, "")
	syncAfterCache()
	assert.Equal(t, v1beta1.InstanceStateStopped, get().Status.CurrentState)
	assert.Empty(t, get().Status.IP)
	assert.FileExists(t, filepath.Join(disk, "replicas", "r1", "volume.meta"))

	// deleted: the data directory goes, then the finalizer.
	require.NoError(t, env.Strata.StrataV1beta1().Replicas(fixture.NS).Delete(ctx, "r1", metav1.DeleteOptions{}))
	// The fake clientset deletes at once despite the finalizer; sync from
	// a copy with a deletion timestamp, as the API server would leave it.
	rr := fixture.ReplicaCR("r1", disk, func(r *v1beta1.Replica) {
		now := metav1.NewTime(dstest.Now)
		r.DeletionTimestamp = &now
	})
	_, err = env.Strata.StrataV1beta1().Replicas(fixture.NS).Create(ctx, rr, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := env.DS.Replicas.GetRO("r1")
		return err == nil && r.DeletionTimestamp != nil
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, c.syncReplica(ctx, key))
	_, statErr := os.Stat(filepath.Join(disk, "replicas", "r1"))
	assert.True(t, os.IsNotExist(statErr), "data directory deleted")
	r = get()
	assert.NotContains(t, r.Finalizers, types.FinalizerName)
	fixture.AssertEvents(t, []string{"Normal DataDeleted"}, rec)
}

func TestEngineControllerAgainstRealInstanceManager(t *testing.T) {
	im := kittest.StartRealIM(t)
	disk := t.TempDir()
	ctx := context.Background()
	addrs := im.StartReplicas(t, disk, "r1", "r2")
	e := &v1beta1.Engine{
		ObjectMeta: metav1.ObjectMeta{Name: "v1-e-0", Namespace: fixture.NS, Finalizers: []string{types.FinalizerName}},
		Spec: v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1", VolumeSize: 4 << 20, NodeID: "node-1",
			DesireState: v1beta1.InstanceStateRunning}, ReplicaAddressMap: addrs},
	}
	env := dstest.New(t, []runtime.Object{e, fixture.SchedNode("node-1")}, []runtime.Object{fixture.Lease("node-1", 0)})
	rec := record.NewFakeRecorder(20)
	c, err := NewEngineController(logrus.New(), env.DS, rec, "node-1", im.Addr, im.Pool, im.Instances())
	require.NoError(t, err)
	key := fixture.NS + "/v1-e-0"
	get := func() *v1beta1.Engine {
		e, err := env.Strata.StrataV1beta1().Engines(fixture.NS).Get(ctx, "v1-e-0", metav1.GetOptions{})
		require.NoError(t, err)
		return e
	}
	syncAfterCache := func() {
		t.Helper()
		want := get()
		require.Eventually(t, func() bool {
			e, err := env.DS.Engines.GetRO("v1-e-0")
			return err == nil && equality.Semantic.DeepEqual(e.Spec, want.Spec) && equality.Semantic.DeepEqual(e.Status, want.Status)
		}, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, c.syncEngine(ctx, key))
	}

	require.NoError(t, c.syncEngine(ctx, key))
	im.WaitInstance(t, "v1-e-0", true, engineapi.InstanceStateRunning)
	syncAfterCache()
	got := get()
	assert.Equal(t, v1beta1.InstanceStateRunning, got.Status.CurrentState)
	assert.Equal(t, map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW}, got.Status.ReplicaModeMap)
	assert.Equal(t, addrs, got.Status.CurrentReplicaAddressMap)
	assert.Contains(t, got.Status.Snapshots, "volume-head", "the engine monitor copies the chain")
	assert.Equal(t, int64(4<<20), got.Status.CurrentSize)

	// An unchanged instance writes nothing: the monitor compares first.
	env.ClearActions()
	syncAfterCache()
	assert.Empty(t, fixture.Writes(env.Strata.Actions()))

	// A larger spec size while it runs: online expansion of the engine
	// and its replicas; the status follows from the Watch.
	got = get()
	got.Spec.VolumeSize = 8 << 20
	_, err = env.Strata.StrataV1beta1().Engines(fixture.NS).Update(ctx, got, metav1.UpdateOptions{})
	require.NoError(t, err)
	syncAfterCache()
	require.Eventually(t, func() bool {
		inst, _, _ := im.Cache.Get("v1-e-0")
		return inst.Size == 8<<20
	}, 10*time.Second, 10*time.Millisecond)
	syncAfterCache()
	assert.Equal(t, int64(8<<20), get().Status.CurrentSize)
	fixture.AssertEvents(t, []string{"Normal Expanded"}, rec)
	for _, r := range []string{"r1", "r2"} { // replicas report their size at the size-report interval
		require.Eventually(t, func() bool {
			inst, _, _ := im.Cache.Get(r)
			return inst.Size == 8<<20
		}, 15*time.Second, 50*time.Millisecond, "replica %s grew", r)
	}

	// The spec drops r2: the engine removes it and the status follows.
	got.Spec.ReplicaAddressMap = map[string]string{"r1": addrs["r1"]}
	_, err = env.Strata.StrataV1beta1().Engines(fixture.NS).Update(ctx, got, metav1.UpdateOptions{})
	require.NoError(t, err)
	syncAfterCache()
	require.Eventually(t, func() bool {
		inst, _, _ := im.Cache.Get("v1-e-0")
		return len(inst.ReplicaModes) == 1
	}, 10*time.Second, 10*time.Millisecond)
	syncAfterCache()
	assert.Equal(t, map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW}, get().Status.ReplicaModeMap)
	fixture.AssertEvents(t, []string{"Normal ReplicaRemoved"}, rec)

	// Desire stopped: the instance goes; the snapshot map stays as the last word.
	got = get()
	got.Spec.DesireState = v1beta1.InstanceStateStopped
	_, err = env.Strata.StrataV1beta1().Engines(fixture.NS).Update(ctx, got, metav1.UpdateOptions{})
	require.NoError(t, err)
	syncAfterCache()
	im.WaitInstance(t, "v1-e-0", false, "")
	syncAfterCache()
	got = get()
	assert.Equal(t, v1beta1.InstanceStateStopped, got.Status.CurrentState)
	assert.Nil(t, got.Status.ReplicaModeMap)
	assert.Contains(t, got.Status.Snapshots, "volume-head")
}

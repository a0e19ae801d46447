package datastore_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const ns = types.DefaultNamespace

func meta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: ns} }

func replica(name, volume, node, disk, image string) *v1beta1.Replica {
	r := &v1beta1.Replica{ObjectMeta: meta(name)}
	r.Spec.VolumeName, r.Spec.NodeID, r.Spec.DiskID, r.Spec.BackingImage = volume, node, disk, image
	return r
}

func names[T datastore.Object](objs []T) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetName())
	}
	sort.Strings(out)
	return out
}

func TestIndexers(t *testing.T) {
	env := dstest.New(t, []runtime.Object{
		replica("v1-r1", "v1", "node-1", "disk-a", "img"),
		replica("v1-r2", "v1", "node-2", "disk-b", "img"),
		replica("v2-r1", "v2", "node-1", "disk-a", ""),
		replica("unscheduled", "v3", "", "", ""),
		&v1beta1.Snapshot{ObjectMeta: meta("s1"), Spec: v1beta1.SnapshotSpec{Volume: "v1"}},
		&v1beta1.Snapshot{ObjectMeta: meta("s2"), Spec: v1beta1.SnapshotSpec{Volume: "v2"}},
		&v1beta1.Engine{ObjectMeta: meta("v1-e"), Spec: v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1", NodeID: "node-2"}}},
		&v1beta1.VolumeAttachment{ObjectMeta: meta("v1"), Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1"}},
		&v1beta1.Volume{ObjectMeta: meta("v1"), Spec: v1beta1.VolumeSpec{BackingImage: "img"}},
		&v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "b-label", Namespace: ns, Labels: map[string]string{types.LabelVolume: "v1"}}},
		&v1beta1.Backup{ObjectMeta: meta("b-status"), Status: v1beta1.BackupStatus{VolumeName: "v1"}},
	}, nil)
	ds := env.DS

	tests := []struct {
		name  string
		list  func() ([]string, error)
		names []string
	}{
		{"replicas by volume", func() ([]string, error) {
			r, err := ds.Replicas.ListByIndexRO(datastore.IndexByVolume, "v1")
			return names(r), err
		}, []string{"v1-r1", "v1-r2"}},
		{"replicas by node", func() ([]string, error) {
			r, err := ds.Replicas.ListByIndexRO(datastore.IndexByNode, "node-1")
			return names(r), err
		}, []string{"v1-r1", "v2-r1"}},
		{"replicas by disk", func() ([]string, error) {
			r, err := ds.Replicas.ListByIndexRO(datastore.IndexByDisk, "disk-b")
			return names(r), err
		}, []string{"v1-r2"}},
		{"replicas by backing image", func() ([]string, error) {
			r, err := ds.Replicas.ListByIndexRO(datastore.IndexByBackingImage, "img")
			return names(r), err
		}, []string{"v1-r1", "v1-r2"}},
		{"unscheduled replica is in no node index", func() ([]string, error) {
			r, err := ds.Replicas.ListByIndexRO(datastore.IndexByNode, "")
			return names(r), err
		}, []string{}},
		{"snapshots by volume", func() ([]string, error) {
			r, err := ds.Snapshots.ListByIndexRO(datastore.IndexByVolume, "v2")
			return names(r), err
		}, []string{"s2"}},
		{"engines by node", func() ([]string, error) {
			r, err := ds.Engines.ListByIndexRO(datastore.IndexByNode, "node-2")
			return names(r), err
		}, []string{"v1-e"}},
		{"volume attachments by volume", func() ([]string, error) {
			r, err := ds.VolumeAttachments.ListByIndexRO(datastore.IndexByVolume, "v1")
			return names(r), err
		}, []string{"v1"}},
		{"volumes by backing image", func() ([]string, error) {
			r, err := ds.Volumes.ListByIndexRO(datastore.IndexByBackingImage, "img")
			return names(r), err
		}, []string{"v1"}},
		{"backups by volume, from label or status", func() ([]string, error) {
			r, err := ds.Backups.ListByIndexRO(datastore.IndexByVolume, "v1")
			return names(r), err
		}, []string{"b-label", "b-status"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.list()
			require.NoError(t, err)
			assert.Equal(t, tc.names, got)
		})
	}
}

func TestGetCopiesAndGetROShares(t *testing.T) {
	env := dstest.New(t, []runtime.Object{&v1beta1.Volume{ObjectMeta: meta("v1")}}, nil)

	cp, err := env.DS.Volumes.Get("v1")
	require.NoError(t, err)
	cp.Spec.NodeID = "changed"
	ro, err := env.DS.Volumes.GetRO("v1")
	require.NoError(t, err)
	assert.Empty(t, ro.Spec.NodeID, "changing a Get copy must not change the cache")

	_, err = env.DS.Volumes.GetRO("missing")
	assert.True(t, apierrors.IsNotFound(err), "missing object gives NotFound, got %v", err)
}

func TestFinalizerHelpersWriteOnlyWhenNeeded(t *testing.T) {
	vol := &v1beta1.Volume{ObjectMeta: meta("v1")}
	env := dstest.New(t, []runtime.Object{vol}, nil)
	ctx := context.Background()

	tests := []struct {
		name       string
		do         func(*v1beta1.Volume) (*v1beta1.Volume, error)
		want       []string
		wantWrites int
	}{
		{"add missing finalizer", func(v *v1beta1.Volume) (*v1beta1.Volume, error) {
			return env.DS.Volumes.AddFinalizer(ctx, v, types.FinalizerName)
		}, []string{types.FinalizerName}, 1},
		{"add present finalizer is a no-op", func(v *v1beta1.Volume) (*v1beta1.Volume, error) {
			return env.DS.Volumes.AddFinalizer(ctx, v, types.FinalizerName)
		}, []string{types.FinalizerName}, 0},
		{"remove present finalizer", func(v *v1beta1.Volume) (*v1beta1.Volume, error) {
			return env.DS.Volumes.RemoveFinalizer(ctx, v, types.FinalizerName)
		}, []string{}, 1},
		{"remove missing finalizer is a no-op", func(v *v1beta1.Volume) (*v1beta1.Volume, error) {
			return env.DS.Volumes.RemoveFinalizer(ctx, v, types.FinalizerName)
		}, []string{}, 0},
	}
	current := vol
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env.ClearActions()
			before := current.DeepCopy()
			got, err := tc.do(current)
			require.NoError(t, err)
			assert.ElementsMatch(t, tc.want, got.Finalizers)
			assert.Len(t, env.Strata.Actions(), tc.wantWrites)
			assert.Equal(t, before, current, "the object passed in is never mutated")
			current = got
		})
	}
}

func lease(node string, renewedAgo time.Duration, seconds int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: types.NodeLeaseName(node), Namespace: ns,
			Labels: map[string]string{types.LabelComponent: types.ComponentNodeLease}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(node),
			LeaseDurationSeconds: ptr.To(seconds),
			RenewTime:            &metav1.MicroTime{Time: dstest.Now.Add(-renewedAgo)},
		},
	}
}

func TestNodeLiveness(t *testing.T) {
	never := lease("node-4", 0, 10)
	never.Spec.RenewTime = nil
	env := dstest.New(t, []runtime.Object{
		&v1beta1.Node{ObjectMeta: meta("node-1")},
		&v1beta1.Node{ObjectMeta: meta("node-2")},
		&v1beta1.Node{ObjectMeta: meta("node-3")},
		&v1beta1.Node{ObjectMeta: meta("node-4")},
	}, []runtime.Object{
		lease("node-1", 5*time.Second, 10),
		lease("node-2", 11*time.Second, 10),
		never,
		lease("unregistered", 0, 10),
	})

	tests := []struct {
		node  string
		alive bool
	}{
		{"node-1", true},       // renewed within its duration
		{"node-2", false},      // expired
		{"node-3", false},      // no lease
		{"node-4", false},      // never renewed
		{"unregistered", true}, // alive, but not a registered node
	}
	for _, tc := range tests {
		assert.Equal(t, tc.alive, env.DS.IsNodeAlive(tc.node), tc.node)
	}
	alive, err := env.DS.AliveNodeNames()
	require.NoError(t, err)
	assert.Equal(t, []string{"node-1"}, alive, "only registered nodes with live leases")

	env.Clock.Step(6 * time.Second)
	assert.False(t, env.DS.IsNodeAlive("node-1"), "a lease expires as time passes")
}

func TestEnsureDefaultSettings(t *testing.T) {
	custom := &v1beta1.Setting{ObjectMeta: meta(string(types.SettingDefaultReplicaCount)), Value: "2"}
	env := dstest.New(t, []runtime.Object{custom}, nil)

	created, err := env.DS.EnsureDefaultSettings(context.Background())
	require.NoError(t, err)
	assert.Len(t, created, len(types.SettingDefinitions)-1, "every missing setting is created")
	assert.NotContains(t, created, types.SettingDefaultReplicaCount, "an existing setting is left alone")

	n, err := env.DS.GetSettingInt(types.SettingDefaultReplicaCount)
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the stored value wins over the default")

	purge, err := env.DS.GetSettingBool(types.SettingDisableSnapshotPurge)
	require.NoError(t, err)
	assert.False(t, purge, "a setting not yet in the cache reads as its default")
}

func TestSettingWithBadStoredValueIsAnError(t *testing.T) {
	bad := &v1beta1.Setting{ObjectMeta: meta(string(types.SettingDefaultReplicaCount)), Value: "many"}
	env := dstest.New(t, []runtime.Object{bad}, nil)
	_, err := env.DS.GetSettingInt(types.SettingDefaultReplicaCount)
	require.EqualError(t, err, `setting default-replica-count: value "many" is not an integer`)
}

// TestWriteErrorsNameTheCallAndKeepTheStatus: a failed write says which
// call on which object failed, and the API status still reads through it.
func TestWriteErrorsNameTheCallAndKeepTheStatus(t *testing.T) {
	gr := v1beta1.Resource("volumes")
	tests := []struct {
		name    string
		verb    string
		apiErr  error
		write   func(*datastore.DataStore) error
		wantMsg string
		is      func(error) bool
	}{
		{name: "update conflict", verb: "update", apiErr: apierrors.NewConflict(gr, "v1", nil),
			write: func(ds *datastore.DataStore) error {
				_, err := ds.Volumes.Update(context.Background(), &v1beta1.Volume{ObjectMeta: meta("v1")})
				return err
			}, wantMsg: "updating volumes v1: ", is: apierrors.IsConflict},
		{name: "status update forbidden", verb: "update", apiErr: apierrors.NewForbidden(gr, "v1", nil),
			write: func(ds *datastore.DataStore) error {
				_, err := ds.Volumes.UpdateStatus(context.Background(), &v1beta1.Volume{ObjectMeta: meta("v1")})
				return err
			}, wantMsg: "updating the status of volumes v1: ", is: apierrors.IsForbidden},
		{name: "create exists", verb: "create", apiErr: apierrors.NewAlreadyExists(gr, "v2"),
			write: func(ds *datastore.DataStore) error {
				_, err := ds.Volumes.Create(context.Background(), &v1beta1.Volume{ObjectMeta: meta("v2")})
				return err
			}, wantMsg: "creating volumes v2: ", is: apierrors.IsAlreadyExists},
		{name: "delete failing", verb: "delete", apiErr: apierrors.NewServiceUnavailable("etcd is down"),
			write:   func(ds *datastore.DataStore) error { return ds.Volumes.Delete(context.Background(), "v1") },
			wantMsg: "deleting volumes v1: etcd is down", is: apierrors.IsServiceUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{&v1beta1.Volume{ObjectMeta: meta("v1")}}, nil)
			env.Strata.PrependReactor(tc.verb, "volumes", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, tc.apiErr
			})
			err := tc.write(env.DS)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantMsg)
			assert.True(t, tc.is(err), "the API status reads through the wrapping: %v", err)
		})
	}
}

// TestGetROOrLiveReadsThroughAMissFromTheCache: an object the cache has not
// seen yet (created a moment ago) is read from the API server; one that
// exists nowhere stays NotFound.
func TestGetROOrLiveReadsThroughAMissFromTheCache(t *testing.T) {
	env := dstest.New(t, []runtime.Object{&v1beta1.Volume{ObjectMeta: meta("cached")}}, nil)
	env.Strata.PrependReactor("get", "volumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == "fresh" {
			return true, &v1beta1.Volume{ObjectMeta: meta("fresh")}, nil
		}
		return false, nil, nil
	})
	tests := []struct {
		name, volume string
		wantNotFound bool
	}{
		{name: "in the cache", volume: "cached"},
		{name: "not in the cache yet, on the API server", volume: "fresh"},
		{name: "nowhere", volume: "missing", wantNotFound: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := env.DS.Volumes.GetROOrLive(context.Background(), tc.volume)
			if tc.wantNotFound {
				assert.True(t, apierrors.IsNotFound(err), "got %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.volume, v.Name)
		})
	}
}

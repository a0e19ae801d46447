package node

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit/kittest"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestOrphanedDirectories(t *testing.T) {
	tests := []struct {
		name     string
		dirs     []string
		replicas []*v1beta1.Replica
		want     []string
	}{
		{name: "no replicas directory", want: nil},
		{name: "every directory named", dirs: []string{"a", "b"},
			replicas: []*v1beta1.Replica{fixture.ReplicaCR("a", "/d"), fixture.ReplicaCR("b", "/d")}, want: nil},
		{name: "unnamed directories are orphans, sorted", dirs: []string{"c", "a", "b"},
			replicas: []*v1beta1.Replica{fixture.ReplicaCR("b", "/d")}, want: []string{"a", "c"}},
		{name: "a replica being deleted still names its directory", dirs: []string{"a"},
			replicas: []*v1beta1.Replica{fixture.ReplicaCR("a", "/d", func(r *v1beta1.Replica) {
				r.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
			})}, want: nil},
		{name: "a directory any replica names is not an orphan, whatever its node (the deletion's rule)", dirs: []string{"a"},
			replicas: []*v1beta1.Replica{fixture.ReplicaCR("a", "/d", func(r *v1beta1.Replica) { r.Spec.NodeID = "node-2" })},
			want:     nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			disk := t.TempDir()
			fixture.MkReplicaDirs(t, disk, tc.dirs...)
			var objs []runtime.Object
			for _, r := range tc.replicas {
				objs = append(objs, r)
			}
			env := dstest.New(t, objs, nil)
			nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil, NodeControllerOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.want, nc.orphanedDirectories(disk))
		})
	}
}

// TestOrphanCleanupAgainstRealInstanceManager: a replica directory and a
// running instance left behind by a replica that went while the instance
// manager was unreachable are reported, then removed once the view is live;
// a directory a replica names is never touched.
func TestOrphanCleanupAgainstRealInstanceManager(t *testing.T) {
	im := kittest.StartRealIM(t)
	disk := t.TempDir()
	ctx := context.Background()
	client, err := im.Pool.Get(im.Addr)
	require.NoError(t, err)
	// "gone" runs in the instance manager (reopened after a restart, say)
	// though no Replica names it any more; "kept" is a live replica's.
	_, err = client.InstanceCreate(ctx, &impb.InstanceCreateRequest{Name: "gone", Type: impb.InstanceType_INSTANCE_TYPE_REPLICA,
		VolumeName: "v1", Size: 4 << 20, DataDir: filepath.Join(disk, "replicas", "gone")})
	require.NoError(t, err)
	im.WaitInstance(t, "gone", true, engineapi.InstanceStateRunning)
	fixture.MkReplicaDirs(t, disk, "kept", "stray")

	node := fixture.Node("node-1", map[string]string{"disk-1": disk}, fixture.ReadyTrue())
	env := dstest.New(t, []runtime.Object{node, fixture.ZeroMinAvailable(), fixture.ReplicaCR("kept", disk)}, nil)
	rec := record.NewFakeRecorder(20)
	nc, err := NewNodeController(logrus.New(), env.DS, rec, "node-1", nil,
		NodeControllerOptions{Instances: im.Instances(), IMAddress: im.Addr, DataPlane: im.Pool})
	require.NoError(t, err)

	key := fixture.NS + "/node-1"
	require.NoError(t, nc.syncNode(ctx, key))
	got, err := env.Strata.StrataV1beta1().Nodes(fixture.NS).Get(ctx, "node-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"gone", "stray"}, got.Status.DiskStatus["disk-1"].OrphanedReplicaDirectories, "reported in the status")

	im.WaitInstance(t, "gone", false, "")
	assert.NoDirExists(t, filepath.Join(disk, "replicas", "gone"))
	assert.NoDirExists(t, filepath.Join(disk, "replicas", "stray"))
	assert.DirExists(t, filepath.Join(disk, "replicas", "kept"))
	fixture.AssertEvents(t, []string{"Normal OrphanedInstanceStopped", "Normal OrphanedDataDeleted", "Normal OrphanedDataDeleted"}, rec)

	// The next pass finds nothing left and clears the status.
	require.Eventually(t, func() bool {
		n, _ := env.DS.Nodes.GetRO("node-1")
		return n != nil && len(n.Status.DiskStatus["disk-1"].OrphanedReplicaDirectories) == 2
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, nc.syncNode(ctx, key))
	got, err = env.Strata.StrataV1beta1().Nodes(fixture.NS).Get(ctx, "node-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Empty(t, got.Status.DiskStatus["disk-1"].OrphanedReplicaDirectories)
}

// TestOrphansKept: orphans are reported and kept without a live view of the
// instance manager, and when orphaned-data-auto-deletion is false.
func TestOrphansKept(t *testing.T) {
	off := &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingOrphanedDataAutoDeletion), Namespace: fixture.NS}, Value: "false"}
	tests := []struct {
		name    string
		setting []runtime.Object
		live    bool
	}{
		{name: "instance manager unreachable"},
		{name: "auto-deletion off", setting: []runtime.Object{off}, live: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := NodeControllerOptions{Instances: kittest.LostStream(), IMAddress: "127.0.0.1:1"}
			if tc.live {
				im := kittest.StartRealIM(t)
				opts = NodeControllerOptions{Instances: im.Instances(), IMAddress: im.Addr, DataPlane: im.Pool}
			}
			disk := t.TempDir()
			fixture.MkReplicaDirs(t, disk, "stray")
			objs := append([]runtime.Object{fixture.Node("node-1", map[string]string{"disk-1": disk}, fixture.ReadyTrue()), fixture.ZeroMinAvailable()}, tc.setting...)
			env := dstest.New(t, objs, nil)
			nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil, opts)
			require.NoError(t, err)
			require.NoError(t, nc.syncNode(context.Background(), fixture.NS+"/node-1"))
			got, err := env.Strata.StrataV1beta1().Nodes(fixture.NS).Get(context.Background(), "node-1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, []string{"stray"}, got.Status.DiskStatus["disk-1"].OrphanedReplicaDirectories)
			assert.DirExists(t, filepath.Join(disk, "replicas", "stray"))
		})
	}
}

package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestNodeControllerSync(t *testing.T) {
	const me = "node-1"
	// node-x is dead; with node-1 and node-3 alive, find which one rendezvous
	// hashing makes responsible so both outcomes are tested.
	deadKey := fixture.NS + "/node-x"
	owner := kit.ResponsibleNode(deadKey, "node-x", "", []string{"node-1", "node-3"})
	other := "node-3"
	if owner == "node-3" {
		other = "node-1"
	}

	tests := []struct {
		name        string
		controller  string // defaults to node-1
		key         string
		nodes       func(diskDir string) []runtime.Object
		leases      []runtime.Object
		prepareDisk func(t *testing.T, diskDir string)
		apiErr      *fixture.ReactorError
		wantErr     string
		wantWrites  []string
		wantEvents  []string
		check       func(t *testing.T, n *v1beta1.Node, diskDir string)
	}{
		{
			name:       "own node missing is registered with its disks",
			key:        me,
			nodes:      func(string) []runtime.Object { return nil },
			wantWrites: []string{"create nodes node-1"},
			wantEvents: []string{"Normal Registered"},
			check: func(t *testing.T, n *v1beta1.Node, diskDir string) {
				assert.True(t, n.Spec.AllowScheduling)
				assert.Equal(t, v1beta1.DiskSpec{Path: diskDir, AllowScheduling: true}, n.Spec.Disks["disk-1"])
				assert.Equal(t, me, n.Labels[types.LabelNode])
			},
		},
		{
			name: "own node waits for its heartbeat lease before claiming Ready",
			key:  me,
			nodes: func(d string) []runtime.Object {
				return []runtime.Object{fixture.Node(me, map[string]string{"disk-1": d})}
			},
			leases:     []runtime.Object{fixture.Lease(me, time.Minute)},
			wantWrites: []string{"update nodes/status node-1"},
			check: func(t *testing.T, n *v1beta1.Node, _ string) {
				assert.Nil(t, meta.FindStatusCondition(n.Status.Conditions, v1beta1.ConditionTypeReady))
				assert.NotNil(t, n.Status.DiskStatus["disk-1"], "disks are reported meanwhile")
			},
		},
		{
			name: "own node gets Ready, disk identity and space",
			key:  me,
			nodes: func(d string) []runtime.Object {
				return []runtime.Object{fixture.Node(me, map[string]string{"disk-1": d})}
			},
			leases:     []runtime.Object{fixture.Lease(me, 0)},
			wantWrites: []string{"update nodes/status node-1"},
			wantEvents: []string{"Normal ManagerRunning"},
			check: func(t *testing.T, n *v1beta1.Node, diskDir string) {
				assert.True(t, meta.IsStatusConditionTrue(n.Status.Conditions, v1beta1.ConditionTypeReady))
				assert.True(t, meta.IsStatusConditionTrue(n.Status.Conditions, v1beta1.ConditionTypeSchedulable))
				ds := n.Status.DiskStatus["disk-1"]
				require.NotNil(t, ds)
				cfg, err := os.ReadFile(filepath.Join(diskDir, types.DiskConfigFile))
				require.NoError(t, err)
				assert.Contains(t, string(cfg), ds.DiskUUID, "UUID comes from the disk's config file")
				assert.Positive(t, ds.StorageMaximum)
				assert.Positive(t, ds.StorageAvailable)
				assert.True(t, meta.IsStatusConditionTrue(ds.Conditions, v1beta1.ConditionTypeSchedulable))
				assert.Equal(t, diskDir, n.Status.DiskPaths)
			},
		},
		{
			name:   "missing disk path makes the disk not ready, with its reason",
			key:    me,
			leases: []runtime.Object{fixture.Lease(me, 0)},
			nodes: func(d string) []runtime.Object {
				return []runtime.Object{fixture.Node(me, map[string]string{"disk-1": filepath.Join(d, "absent")})}
			},
			wantWrites: []string{"update nodes/status node-1"},
			wantEvents: []string{"Normal ManagerRunning", "Warning DiskNotReady"},
			check: func(t *testing.T, n *v1beta1.Node, _ string) {
				c := meta.FindStatusCondition(n.Status.DiskStatus["disk-1"].Conditions, v1beta1.ConditionTypeReady)
				require.NotNil(t, c)
				assert.Equal(t, v1beta1.DiskConditionReasonPathMissing, c.Reason)
				s := meta.FindStatusCondition(n.Status.Conditions, v1beta1.ConditionTypeSchedulable)
				assert.Equal(t, v1beta1.NodeConditionReasonNoDisk, s.Reason)
			},
		},
		{
			name:   "a disk remounted at another path and added there is the same disk; the old entry is DiskMigrated",
			key:    me,
			leases: []runtime.Object{fixture.Lease(me, 0)},
			nodes: func(d string) []runtime.Object {
				n := fixture.Node(me, map[string]string{"old": filepath.Join(d, "gone"), "new": d})
				n.Status.DiskStatus = map[string]*v1beta1.DiskStatus{"old": {DiskUUID: "uuid-moved"}}
				return []runtime.Object{n}
			},
			prepareDisk: func(t *testing.T, d string) {
				require.NoError(t, os.WriteFile(filepath.Join(d, types.DiskConfigFile), []byte(`{"diskUUID":"uuid-moved"}`), 0o644))
			},
			wantWrites: []string{"update nodes/status node-1"},
			wantEvents: []string{"Normal ManagerRunning", "Warning DiskNotReady"},
			check: func(t *testing.T, n *v1beta1.Node, d string) {
				old := meta.FindStatusCondition(n.Status.DiskStatus["old"].Conditions, v1beta1.ConditionTypeReady)
				require.NotNil(t, old)
				assert.Equal(t, v1beta1.DiskConditionReasonMigrated, old.Reason)
				assert.Contains(t, old.Message, "is now at "+d)
				assert.False(t, meta.IsStatusConditionTrue(n.Status.DiskStatus["old"].Conditions, v1beta1.ConditionTypeSchedulable))
				assert.Equal(t, "uuid-moved", n.Status.DiskStatus["new"].DiskUUID)
				assert.True(t, meta.IsStatusConditionTrue(n.Status.DiskStatus["new"].Conditions, v1beta1.ConditionTypeSchedulable))
				loc := datastore.NodeDisks(n)["uuid-moved"]
				assert.Equal(t, d, loc.Path, "lookups by UUID find the ready entry")
			},
		},
		{
			name:   "a known disk whose config file is gone is not given a new identity (an unmounted disk's mount point)",
			key:    me,
			leases: []runtime.Object{fixture.Lease(me, 0)},
			nodes: func(d string) []runtime.Object {
				n := fixture.Node(me, map[string]string{"disk-1": d})
				n.Status.DiskStatus = map[string]*v1beta1.DiskStatus{"disk-1": {DiskUUID: "uuid-known"}}
				return []runtime.Object{n}
			},
			wantWrites: []string{"update nodes/status node-1"},
			wantEvents: []string{"Normal ManagerRunning", "Warning DiskNotReady"},
			check: func(t *testing.T, n *v1beta1.Node, d string) {
				c := meta.FindStatusCondition(n.Status.DiskStatus["disk-1"].Conditions, v1beta1.ConditionTypeReady)
				require.NotNil(t, c)
				assert.Equal(t, v1beta1.DiskConditionReasonPathMissing, c.Reason)
				assert.Contains(t, c.Message, "is the disk unmounted")
				assert.NoFileExists(t, filepath.Join(d, types.DiskConfigFile))
			},
		},
		{
			name:   "damaged disk config is reported and left untouched",
			key:    me,
			leases: []runtime.Object{fixture.Lease(me, 0)},
			nodes: func(d string) []runtime.Object {
				return []runtime.Object{fixture.Node(me, map[string]string{"disk-1": d})}
			},
			prepareDisk: func(t *testing.T, d string) {
				require.NoError(t, os.WriteFile(filepath.Join(d, types.DiskConfigFile), []byte("{torn"), 0o644))
			},
			wantWrites: []string{"update nodes/status node-1"},
			wantEvents: []string{"Normal ManagerRunning", "Warning DiskNotReady"},
			check: func(t *testing.T, n *v1beta1.Node, d string) {
				c := meta.FindStatusCondition(n.Status.DiskStatus["disk-1"].Conditions, v1beta1.ConditionTypeReady)
				assert.Equal(t, v1beta1.DiskConditionReasonUUIDError, c.Reason)
				assert.Contains(t, c.Message, "is damaged")
				data, _ := os.ReadFile(filepath.Join(d, types.DiskConfigFile))
				assert.Equal(t, "{torn", string(data))
			},
		},
		{
			name: "status write failure is returned for retry",
			key:  me,
			nodes: func(d string) []runtime.Object {
				return []runtime.Object{fixture.Node(me, map[string]string{"disk-1": d})}
			},
			apiErr:     &fixture.ReactorError{Verb: "update", Resource: "nodes", Subresource: "status", Err: errors.New("etcd is sad")},
			wantErr:    "etcd is sad",
			wantWrites: []string{"update nodes/status node-1"},
		},
		{
			name: "peer with a live lease is left alone",
			key:  "node-2",
			nodes: func(string) []runtime.Object {
				return []runtime.Object{fixture.Node("node-2", nil, fixture.ReadyTrue())}
			},
			leases: []runtime.Object{fixture.Lease("node-2", 3*time.Second), fixture.Lease(me, 0)},
		},
		{
			name:       "peer with an expired lease is marked down by the responsible manager",
			controller: owner,
			key:        "node-x",
			nodes: func(string) []runtime.Object {
				return []runtime.Object{fixture.Node("node-x", nil, fixture.ReadyTrue()), fixture.Node("node-1", nil), fixture.Node("node-3", nil)}
			},
			leases:     []runtime.Object{fixture.Lease("node-x", 30*time.Second), fixture.Lease("node-1", 0), fixture.Lease("node-3", 0)},
			wantWrites: []string{"update nodes/status node-x"},
			wantEvents: []string{"Warning ManagerDown"},
			check: func(t *testing.T, n *v1beta1.Node, _ string) {
				c := meta.FindStatusCondition(n.Status.Conditions, v1beta1.ConditionTypeReady)
				assert.Equal(t, metav1.ConditionFalse, c.Status)
				assert.Equal(t, v1beta1.NodeConditionReasonManagerDown, c.Reason)
				assert.Contains(t, c.Message, "lease expired at 2026-11-21T11:59:40Z")
			},
		},
		{
			name:       "peer with an expired lease is not written by the other managers",
			controller: other,
			key:        "node-x",
			nodes: func(string) []runtime.Object {
				return []runtime.Object{fixture.Node("node-x", nil, fixture.ReadyTrue()), fixture.Node("node-1", nil), fixture.Node("node-3", nil)}
			},
			leases: []runtime.Object{fixture.Lease("node-x", 30*time.Second), fixture.Lease("node-1", 0), fixture.Lease("node-3", 0)},
		},
		{
			name: "peer without any lease is down",
			key:  "node-2",
			nodes: func(string) []runtime.Object {
				return []runtime.Object{fixture.Node("node-2", nil, fixture.ReadyTrue()), fixture.Node(me, nil)}
			},
			leases:     []runtime.Object{fixture.Lease(me, 0)},
			wantWrites: []string{"update nodes/status node-2"},
			wantEvents: []string{"Warning ManagerDown"},
			check: func(t *testing.T, n *v1beta1.Node, _ string) {
				c := meta.FindStatusCondition(n.Status.Conditions, v1beta1.ConditionTypeReady)
				assert.Equal(t, "strata-manager has no heartbeat lease", c.Message)
			},
		},
		{
			name: "newly registered peer without a lease yet gets one lease duration",
			key:  "node-2",
			nodes: func(string) []runtime.Object {
				n := fixture.Node("node-2", nil)
				n.CreationTimestamp = metav1.NewTime(dstest.Now.Add(-5 * time.Second))
				return []runtime.Object{n, fixture.Node(me, nil)}
			},
			leases: []runtime.Object{fixture.Lease(me, 0)},
		},
		{
			name: "peer already marked down is not written again",
			key:  "node-2",
			nodes: func(string) []runtime.Object {
				return []runtime.Object{fixture.Node("node-2", nil, fixture.ReadyDown("gone")), fixture.Node(me, nil)}
			},
			leases: []runtime.Object{fixture.Lease("node-2", time.Minute), fixture.Lease(me, 0)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			diskDir := t.TempDir()
			if tc.prepareDisk != nil {
				tc.prepareDisk(t, diskDir)
			}
			objs := append(tc.nodes(diskDir), fixture.ZeroMinAvailable())
			env := dstest.New(t, objs, tc.leases)
			if tc.apiErr != nil {
				tc.apiErr.Install(env.Strata)
			}
			id := tc.controller
			if id == "" {
				id = me
			}
			rec := record.NewFakeRecorder(10)
			nc, err := NewNodeController(logrus.New(), env.DS, rec, id,
				[]DiskConfig{{Name: "disk-1", Path: diskDir}}, NodeControllerOptions{LeaseDuration: 10 * time.Second})
			require.NoError(t, err)
			env.ClearActions()

			err = nc.syncNode(context.Background(), fixture.NS+"/"+tc.key)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()), "API writes")
			fixture.AssertEvents(t, tc.wantEvents, rec)
			if tc.check != nil {
				n, err := env.Strata.StrataV1beta1().Nodes(fixture.NS).Get(context.Background(), tc.key, metav1.GetOptions{})
				require.NoError(t, err)
				tc.check(t, n, diskDir)
			}
		})
	}
}

// A second sync of an unchanged node writes nothing: a quiet node costs no
// API traffic.
func TestOwnNodeSyncIsIdempotent(t *testing.T) {
	diskDir := t.TempDir()
	env := dstest.New(t, []runtime.Object{fixture.Node("node-1", map[string]string{"disk-1": diskDir}), fixture.ZeroMinAvailable()}, nil)
	nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil, NodeControllerOptions{})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, nc.syncNode(ctx, fixture.NS+"/node-1"))
	require.Eventually(t, func() bool {
		n, _ := env.DS.Nodes.GetRO("node-1")
		return n != nil && n.Status.DiskStatus != nil
	}, 5*time.Second, 10*time.Millisecond, "cache sees the status write")

	env.ClearActions()
	require.NoError(t, nc.syncNode(ctx, fixture.NS+"/node-1"))
	assert.Empty(t, fixture.Writes(env.Strata.Actions()))
}

func TestStableAvailable(t *testing.T) {
	const gib = int64(1 << 30)
	tests := []struct {
		name                     string
		previous, current, total int64
		want                     int64
	}{
		{"first report is taken as is", 0, 5 * gib, 100 * gib, 5 * gib},
		{"small drift keeps the old figure", 5 * gib, 5*gib - 10<<20, 100 * gib, 5 * gib},
		{"large change is reported", 5 * gib, 4 * gib, 100 * gib, 4 * gib},
		{"on a small disk 1% counts", 500 << 20, 480 << 20, 1 * gib, 480 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, stableAvailable(tc.previous, tc.current, tc.total))
		})
	}
}

// A change of the minimal-free-space setting re-judges this node's disks at
// once; other settings, and a write that keeps the value, enqueue nothing.
func TestNodeRequeuedOnMinimalAvailableChange(t *testing.T) {
	other := &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingDefaultReplicaCount), Namespace: fixture.NS}, Value: "3"}
	env := dstest.New(t, []runtime.Object{fixture.ZeroMinAvailable(), other}, nil)
	nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil, NodeControllerOptions{})
	require.NoError(t, err)
	for nc.Queue.Len() > 0 { // the initial adds
		key, _ := nc.Queue.Get()
		nc.Queue.Done(key)
	}
	update := func(s *v1beta1.Setting, value string) {
		s = s.DeepCopy()
		s.Value = value
		_, err := env.Strata.StrataV1beta1().Settings(fixture.NS).Update(context.Background(), s, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	// One handler sees one informer's events in order: once the last
	// update (the one that matters) has enqueued the node, the two before
	// it have been handled, and the count says whether they added anything
	// (the queue itself would fold a second add of the key into one).
	q := &addCounter{TypedRateLimitingInterface: nc.Queue}
	nc.Queue = q
	update(other, "2")
	update(fixture.ZeroMinAvailable(), "0")
	update(fixture.ZeroMinAvailable(), "10")
	require.Eventually(t, func() bool { return q.Len() == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 1, q.adds.Load(), "only the change of the disks' verdict enqueued the node")
	key, _ := q.Get()
	assert.Equal(t, fixture.NS+"/node-1", key)
}

// The disks' replica lists follow placements as they happen: a replica
// placed on, moved on or resized on this node enqueues it; one on another
// node, or a change of a replica's state, does not.
func TestNodeRequeuedOnReplicaPlacement(t *testing.T) {
	env := dstest.New(t, []runtime.Object{fixture.ZeroMinAvailable()}, nil)
	nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil, NodeControllerOptions{})
	require.NoError(t, err)
	for nc.Queue.Len() > 0 { // the initial adds
		key, _ := nc.Queue.Get()
		nc.Queue.Done(key)
	}
	q := &addCounter{TypedRateLimitingInterface: nc.Queue}
	nc.Queue = q
	replicas := env.Strata.StrataV1beta1().Replicas(fixture.NS)
	ctx := context.Background()
	replica := func(name, node string) *v1beta1.Replica {
		return &v1beta1.Replica{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fixture.NS},
			Spec: v1beta1.ReplicaSpec{
				InstanceSpec: v1beta1.InstanceSpec{NodeID: node, VolumeSize: 1 << 20}, DiskID: "uuid-" + node,
			},
		}
	}
	waitAdds := func(n int32) {
		t.Helper()
		require.Eventually(t, func() bool { return q.adds.Load() >= n }, 5*time.Second, 10*time.Millisecond)
		assert.EqualValues(t, n, q.adds.Load())
	}

	mine, err := replicas.Create(ctx, replica("mine", "node-1"), metav1.CreateOptions{})
	require.NoError(t, err)
	waitAdds(1)

	// Handled in order: the last one's add proves the three before it added nothing.
	_, err = replicas.Create(ctx, replica("theirs", "node-2"), metav1.CreateOptions{})
	require.NoError(t, err)
	running := mine.DeepCopy()
	running.Status.CurrentState = v1beta1.InstanceStateRunning
	running, err = replicas.UpdateStatus(ctx, running, metav1.UpdateOptions{})
	require.NoError(t, err)
	resized := running.DeepCopy()
	resized.Spec.VolumeSize = 2 << 20
	_, err = replicas.Update(ctx, resized, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitAdds(2)

	require.NoError(t, replicas.Delete(ctx, "theirs", metav1.DeleteOptions{}))
	require.NoError(t, replicas.Delete(ctx, "mine", metav1.DeleteOptions{}))
	waitAdds(3)
}

func TestPlacementChanged(t *testing.T) {
	base := &v1beta1.Replica{Spec: v1beta1.ReplicaSpec{
		InstanceSpec: v1beta1.InstanceSpec{NodeID: "node-1", VolumeSize: 10}, DiskID: "d1",
	}}
	for _, tc := range []struct {
		name   string
		change func(r *v1beta1.Replica)
		want   bool
	}{
		{"nothing", func(*v1beta1.Replica) {}, false},
		{"state only", func(r *v1beta1.Replica) { r.Status.CurrentState = v1beta1.InstanceStateRunning }, false},
		{"node", func(r *v1beta1.Replica) { r.Spec.NodeID = "node-2" }, true},
		{"disk", func(r *v1beta1.Replica) { r.Spec.DiskID = "d2" }, true},
		{"size", func(r *v1beta1.Replica) { r.Spec.VolumeSize = 20 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := base.DeepCopy()
			tc.change(cur)
			assert.Equal(t, tc.want, placementChanged(base, cur))
		})
	}
}

// addCounter counts what is added to a queue, however it is added.
type addCounter struct {
	workqueue.TypedRateLimitingInterface[string]
	adds atomic.Int32
}

func (q *addCounter) Add(key string) {
	q.adds.Add(1)
	q.TypedRateLimitingInterface.Add(key)
}

func (q *addCounter) AddAfter(key string, d time.Duration) {
	q.adds.Add(1)
	q.TypedRateLimitingInterface.AddAfter(key, d)
}

func (q *addCounter) AddRateLimited(key string) {
	q.adds.Add(1)
	q.TypedRateLimitingInterface.AddRateLimited(key)
}

// The daemon starts the heartbeat before its caches sync, so a restarting
// manager renews its lease without waiting for its first list.
func TestHeartbeatStartsBeforeRun(t *testing.T) {
	env := dstest.New(t, nil, nil)
	nc, err := NewNodeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", nil,
		NodeControllerOptions{LeaseDuration: 4 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc.StartHeartbeat(ctx)
	require.Eventually(t, func() bool {
		_, err := env.Kube.CoordinationV1().Leases(fixture.NS).Get(ctx, types.NodeLeaseName("node-1"), metav1.GetOptions{})
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "the lease is held before Run")
}

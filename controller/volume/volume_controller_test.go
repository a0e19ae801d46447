package volume

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// attachedOn is a volume fully attached to node, reconciled by that node,
// with the SnapshotLimit condition its empty chain gives.
// headHolding gives the engine a chain of just its head, holding size bytes.
func headHolding(size int64) func(*v1beta1.Engine) {
	return func(e *v1beta1.Engine) {
		e.Status.Snapshots = map[string]*v1beta1.SnapshotInfo{types.VolumeHeadName: {Name: types.VolumeHeadName, Size: size}}
	}
}

func failedAgo(d time.Duration) func(*v1beta1.Replica) {
	return func(r *v1beta1.Replica) {
		r.Spec.FailedAt = dstest.Now.Add(-d).Format(time.RFC3339)
		r.Spec.DesireState = v1beta1.InstanceStateStopped
	}
}

func TestVolumeControllerSync(t *testing.T) {
	nodes := []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3"),
		&v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingReplicaReplenishmentWaitInterval), Namespace: fixture.NS}, Value: "60"}}
	leases := []runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0), fixture.Lease("node-3", 0)}
	type check = func(t *testing.T, env *dstest.Env)
	volumeIs := func(state v1beta1.VolumeState, robustness v1beta1.VolumeRobustness, current string) check {
		return func(t *testing.T, env *dstest.Env) {
			v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, state, v.Status.State, "state")
			assert.Equal(t, robustness, v.Status.Robustness, "robustness")
			assert.Equal(t, current, v.Status.CurrentNodeID, "currentNodeID")
		}
	}
	engineIs := func(node string, desire v1beta1.InstanceState, replicas ...string) check {
		return func(t *testing.T, env *dstest.Env) {
			e, err := env.Strata.StrataV1beta1().Engines(fixture.NS).Get(context.Background(), "v1-e-0", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, node, e.Spec.NodeID)
			assert.Equal(t, desire, e.Spec.DesireState)
			assert.ElementsMatch(t, replicas, slices.Sorted(maps.Keys(e.Spec.ReplicaAddressMap)))
		}
	}
	replicaIs := func(name string, desire v1beta1.InstanceState, failed bool) check {
		return func(t *testing.T, env *dstest.Env) {
			r, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).Get(context.Background(), name, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, desire, r.Spec.DesireState, "desireState of "+name)
			assert.Equal(t, failed, r.Spec.FailedAt != "", "failed "+name)
		}
	}
	tests := []fixture.SyncCase{
		{
			Name:    "new volume gets an engine and three replicas on three nodes",
			Objects: []runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Status = v1beta1.VolumeStatus{OwnerID: "node-1"} })},
			WantWrites: []string{"create engines v1-e-", "create replicas v1-r-", "create replicas v1-r-", "create replicas v1-r-",
				"update volumes/status v1"},
			WantEvents: []string{"Normal ReplicaScheduled", "Normal ReplicaScheduled", "Normal ReplicaScheduled"},
			Check: fixture.AllChecks(volumeIs(v1beta1.VolumeStateDetached, v1beta1.VolumeRobustnessHealthy, ""),
				func(t *testing.T, env *dstest.Env) {
					reps, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).List(context.Background(), metav1.ListOptions{})
					require.NoError(t, err)
					nodes := map[string]bool{}
					for _, r := range reps.Items {
						nodes[r.Spec.NodeID] = true
						assert.Equal(t, []string{types.FinalizerName}, r.Finalizers)
						assert.Equal(t, "v1", r.Labels[types.LabelVolume])
					}
					assert.Len(t, nodes, 3, "replicas on distinct nodes")
				}),
		},
		{
			Name:       "volume without the finalizer gets it first",
			Objects:    []runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Finalizers = nil })},
			WantWrites: []string{"update volumes v1"},
		},
		{
			Name:       "not responsible: another node owns the volume",
			Objects:    append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Status.OwnerID = "node-2" }), fixture.Engine()}, fixture.ThreeReplicas()...),
			WantWrites: nil,
		},
		{
			Name: "spec.nodeID set: replicas start first, state attaching",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Spec.NodeID = "node-2" }), fixture.Engine()},
				fixture.ThreeReplicas()...),
			WantWrites: []string{"update replicas r1", "update replicas r2", "update replicas r3", "update volumes/status v1"},
			Check: fixture.AllChecks(volumeIs(v1beta1.VolumeStateAttaching, v1beta1.VolumeRobustnessHealthy, ""),
				replicaIs("r1", v1beta1.InstanceStateRunning, false), engineIs("", v1beta1.InstanceStateStopped)),
		},
		{
			Name: "replicas running: engine asked to run on the node with them",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.State = "node-2", v1beta1.VolumeStateAttaching
			}), fixture.Engine()}, fixture.ThreeReplicas(fixture.ReplicaRunning)...),
			WantWrites: []string{"update engines v1-e-0", "update volumes/status v1"},
			Check: fixture.AllChecks(volumeIs(v1beta1.VolumeStateAttaching, v1beta1.VolumeRobustnessHealthy, ""),
				engineIs("node-2", v1beta1.InstanceStateRunning, "r1", "r2", "r3")),
		},
		{
			Name: "engine running with its endpoint: attached, currentNodeID set",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.State, v.Status.OwnerID = "node-2", v1beta1.VolumeStateAttaching, "node-2"
			}), fixture.Engine(fixture.EngineRunningOn("node-2", fixture.AllRW()))}, fixture.ThreeReplicas(fixture.ReplicaRunning)...),
			WantWrites: []string{"update volumes/status v1"},
			WantEvents: []string{"Normal Attached"},
			Check:      fixture.AllChecks(volumeIs(v1beta1.VolumeStateAttached, v1beta1.VolumeRobustnessHealthy, "node-2")),
		},
		{
			Name: "engine marks a replica ERR: replica failed and stopped, volume degraded",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.State, v.Status.CurrentNodeID, v.Status.OwnerID = "node-2", v1beta1.VolumeStateAttached, "node-2", "node-2"
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW,
				"r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeERR}))}, fixture.ThreeReplicas(fixture.ReplicaRunning)...),
			WantWrites: []string{"update replicas r3", "update engines v1-e-0", "update volumes/status v1"},
			WantEvents: []string{"Warning ReplicaFailed", "Warning Degraded"},
			Check: fixture.AllChecks(volumeIs(v1beta1.VolumeStateAttached, v1beta1.VolumeRobustnessDegraded, "node-2"),
				replicaIs("r3", v1beta1.InstanceStateStopped, true), engineIs("node-2", v1beta1.InstanceStateRunning, "r1", "r2")),
		},
		{
			Name: "actualSize follows the chain the engine reports",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2")),
				fixture.Engine(fixture.EngineRunningOn("node-2", fixture.AllRW()), headHolding(72<<20))}, fixture.ThreeReplicas(fixture.ReplicaRunning)...),
			WantWrites: []string{"update volumes/status v1"},
			Check: func(t *testing.T, env *dstest.Env) {
				v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.EqualValues(t, 72<<20, v.Status.ActualSize)
				assert.EqualValues(t, 72<<20, v.Status.HeadSize)
				assert.Zero(t, v.Status.SnapshotsSize+v.Status.RemovedSnapshotsSize)
			},
		},
		{
			Name: "actualSize already reported: nothing to write",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) { v.Status.ActualSize, v.Status.HeadSize = 72<<20, 72<<20 }),
				fixture.Engine(fixture.EngineRunningOn("node-2", fixture.AllRW()), headHolding(72<<20))}, fixture.ThreeReplicas(fixture.ReplicaRunning)...),
			WantWrites: nil,
		},
		{
			Name: "failed replica within the wait interval is not replaced yet",
			Me:   "node-2",
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				fixture.Replica("r1", "node-1", fixture.ReplicaRunning), fixture.Replica("r2", "node-2", fixture.ReplicaRunning), fixture.Replica("r3", "node-3", failedAgo(30*time.Second))},
			WantWrites: nil,
		},
		{
			Name: "a replica on a node whose manager is down stays while the running engine has it RW",
			Me:   "node-2",
			Kube: []runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0), fixture.Lease("node-3", time.Hour)},
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessHealthy
			}), fixture.Engine(fixture.EngineRunningOn("node-2", fixture.AllRW())),
				fixture.Replica("r1", "node-1", fixture.ReplicaRunning), fixture.Replica("r2", "node-2", fixture.ReplicaRunning), fixture.Replica("r3", "node-3", fixture.ReplicaRunning)},
		},
		{
			Name: "a replica on a down node the engine does not have RW is failed",
			Me:   "node-2",
			Kube: []runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0), fixture.Lease("node-3", time.Hour)},
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessHealthy
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeWO})),
				fixture.Replica("r1", "node-1", fixture.ReplicaRunning), fixture.Replica("r2", "node-2", fixture.ReplicaRunning), fixture.Replica("r3", "node-3", fixture.ReplicaRunning)},
			WantWrites: []string{"update replicas r3", "update engines v1-e-0", "update volumes/status v1"},
			WantEvents: []string{"Warning ReplicaFailed", "Warning Degraded"},
		},
		{
			Name: "a failed replica whose node, instance manager and disk are back is reused within the wait",
			Me:   "node-2",
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				fixture.Replica("r1", "node-1", fixture.ReplicaRunning), fixture.Replica("r2", "node-2", fixture.ReplicaRunning), fixture.Replica("r3", "node-3", failedAgo(30*time.Second)),
				fixture.ReadyDiskNode("node-3")},
			WantWrites: []string{"update replicas r3", "update replicas r3"},
			WantEvents: []string{"Normal ReplicaReused"},
			Check: func(t *testing.T, env *dstest.Env) {
				r, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).Get(context.Background(), "r3", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Empty(t, r.Spec.FailedAt)
				assert.Empty(t, r.Spec.HealthyAt, "it is rebuilt before it counts as holding the data")
				assert.Equal(t, v1beta1.InstanceStateRunning, r.Spec.DesireState)
				assert.Equal(t, "1", r.Annotations[annotationReuseAttempts])
			},
		},
		{
			Name: "a failed replica reused too often is left to be replaced",
			Me:   "node-2",
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				fixture.Replica("r1", "node-1", fixture.ReplicaRunning), fixture.Replica("r2", "node-2", fixture.ReplicaRunning),
				fixture.Replica("r3", "node-3", failedAgo(30*time.Second), func(r *v1beta1.Replica) {
					r.Annotations = map[string]string{annotationReuseAttempts: "3"}
				}),
				fixture.ReadyDiskNode("node-3")},
		},
		{
			Name: "the only free node's instance manager is down: no replica there, Scheduled=False names it",
			Me:   "node-2",
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeRW})),
				fixture.Replica("r1", "node-1", failedAgo(2*time.Minute)), fixture.Replica("r2", "node-2", fixture.ReplicaRunning), fixture.Replica("r3", "node-3", fixture.ReplicaRunning),
				&v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
					Spec:   v1beta1.InstanceManagerSpec{NodeID: "node-1"},
					Status: v1beta1.InstanceManagerStatus{CurrentState: v1beta1.InstanceStateError}}},
			WantWrites: []string{"delete replicas r1", "update volumes/status v1"},
			WantEvents: []string{"Warning ReplicaUnschedulable"},
			Check: fixture.AllChecks(func(t *testing.T, env *dstest.Env) {
				v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				c := meta.FindStatusCondition(v.Status.Conditions, v1beta1.VolumeConditionScheduled)
				require.NotNil(t, c)
				assert.Equal(t, metav1.ConditionFalse, c.Status)
				assert.Contains(t, c.Message, "node-1: instance manager im-node-1 is error")
			}),
		},
		{
			Name: "failed replica past the wait interval is replaced by a new one that starts",
			Me:   "node-2",
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), fixture.Engine(fixture.EngineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				fixture.Replica("r1", "node-1", fixture.ReplicaRunning), fixture.Replica("r2", "node-2", fixture.ReplicaRunning), fixture.Replica("r3", "node-3", failedAgo(2*time.Minute))},
			WantWrites: []string{"delete replicas r3", "create replicas v1-r-", "update volumes/status v1"},
			WantEvents: []string{"Normal ReplicaScheduled"},
			Check: fixture.AllChecks(func(t *testing.T, env *dstest.Env) {
				reps, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).List(context.Background(), metav1.ListOptions{})
				require.NoError(t, err)
				for _, r := range reps.Items {
					if r.Name != "r1" && r.Name != "r2" {
						assert.Equal(t, "node-3", r.Spec.NodeID, "the only node free of this volume's replicas")
						assert.Equal(t, v1beta1.InstanceStateRunning, r.Spec.DesireState, "started to be rebuilt")
						assert.Empty(t, r.Spec.HealthyAt, "not healthy before its rebuild")
					}
				}
			}),
		},
		{
			Name: "spec.nodeID cleared: engine stops first, currentNodeID kept while detaching",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.Status.State, v.Status.CurrentNodeID, v.Status.OwnerID = v1beta1.VolumeStateAttached, "node-2", "node-2"
			}), fixture.Engine(fixture.EngineRunningOn("node-2", fixture.AllRW()))}, fixture.ThreeReplicas(fixture.ReplicaRunning)...),
			WantWrites: []string{"update engines v1-e-0", "update volumes/status v1"},
			Check: fixture.AllChecks(volumeIs(v1beta1.VolumeStateDetaching, v1beta1.VolumeRobustnessHealthy, "node-2"),
				engineIs("node-2", v1beta1.InstanceStateStopped, "r1", "r2", "r3")),
		},
		{
			Name: "engine and replicas stopped: detached, currentNodeID cleared",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.Status.State, v.Status.CurrentNodeID = v1beta1.VolumeStateDetaching, "node-2"
			}), fixture.Engine(func(e *v1beta1.Engine) { e.Spec.NodeID = "node-2" })}, fixture.ThreeReplicas()...),
			WantWrites: []string{"update volumes/status v1"},
			WantEvents: []string{"Normal Detached"},
			Check:      fixture.AllChecks(volumeIs(v1beta1.VolumeStateDetached, v1beta1.VolumeRobustnessHealthy, "")),
		},
		{
			Name: "every replica failed: faulted, detached, the latest to fail are salvaged",
			Objects: []runtime.Object{fixture.Volume(), fixture.Engine(),
				fixture.Replica("r1", "node-1", failedAgo(10*time.Minute)), fixture.Replica("r2", "node-2", failedAgo(time.Minute)),
				fixture.Replica("r3", "node-3", failedAgo(time.Minute+10*time.Second))},
			// The decision is recorded before the replicas change.
			WantWrites: []string{"update volumes/status v1", "update replicas r2", "update replicas r3", "update volumes/status v1"},
			WantEvents: []string{"Warning Salvaged", "Warning Degraded"},
			Check: fixture.AllChecks(replicaIs("r1", v1beta1.InstanceStateStopped, true), replicaIs("r2", v1beta1.InstanceStateStopped, false),
				replicaIs("r3", v1beta1.InstanceStateStopped, false)),
		},
		{
			Name: "grown while detached: replicas open at the new size, then the size is recorded",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("2Gi") }), fixture.Engine()},
				fixture.ThreeReplicas(fixture.ReplicaRunning, func(r *v1beta1.Replica) { r.Spec.VolumeSize = 2 * fixture.GiB })...),
			WantWrites: []string{"update volumes/status v1"},
			WantEvents: []string{"Normal Expanded"},
			Check: fixture.AllChecks(func(t *testing.T, env *dstest.Env) {
				v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, 2*fixture.GiB, v.Status.CurrentSize)
			}),
		},
		{
			Name: "deleting: engine and replicas are deleted, the finalizer stays until they are gone",
			Objects: append([]runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
			}), fixture.Engine()}, fixture.ThreeReplicas()...),
			WantWrites: []string{"delete engines v1-e-0", "delete replicas r1", "delete replicas r2", "delete replicas r3", "update volumes/status v1"},
		},
		{
			Name: "deleting with nothing left: the finalizer goes",
			Objects: []runtime.Object{fixture.Volume(func(v *v1beta1.Volume) {
				v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
			})},
			WantWrites: []string{"update volumes v1"},
		},
		{
			Name:       "replica create fails: the error is returned for a retry",
			Objects:    []runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Status = v1beta1.VolumeStatus{OwnerID: "node-1"} })},
			APIErr:     &fixture.ReactorError{Verb: "create", Resource: "replicas", Err: errors.New("etcd is down")},
			WantErr:    "etcd is down",
			WantWrites: []string{"create engines v1-e-", "create replicas v1-r-", "update volumes/status v1"},
		},
	}
	for i := range tests {
		// A case may bring its own version of a node.
		own := map[string]bool{}
		for _, o := range tests[i].Objects {
			if n, ok := o.(*v1beta1.Node); ok {
				own[n.Name] = true
			}
		}
		for _, o := range nodes {
			if n, ok := o.(*v1beta1.Node); !ok || !own[n.Name] {
				tests[i].Objects = append(tests[i].Objects, o)
			}
		}
		if tests[i].Kube == nil {
			tests[i].Kube = leases
		}
	}
	fixture.RunSyncCases(t, tests, volumeSyncer)
}

// volumeSyncer builds the volume controller's sync for fixture.RunSyncCases.
func volumeSyncer(env *dstest.Env, rec record.EventRecorder, me string, _ engineapi.Connector) (func(context.Context, string) error, error) {
	c, err := NewVolumeController(logrus.New(), env.DS, rec, me)
	if err != nil {
		return nil, err
	}
	return c.syncVolume, nil
}

// A replica this manager created holds the volume's next syncs back until
// the cache shows it (or it expired): a sync on the stale cache would place
// another replica, maybe on the same node.
func TestCreatedReplicasHoldSyncsUntilCached(t *testing.T) {
	c := createdReplicas{byVolume: map[string]map[string]time.Time{}}
	now := dstest.Now
	c.add("v1", "v1-r-a", now)
	tests := []struct {
		name   string
		cached []*v1beta1.Replica
		at     time.Time
		want   bool
	}{
		{"not in the cache yet", nil, now.Add(time.Second), true},
		{"another volume is not held", nil, now, false},
		{"in the cache", []*v1beta1.Replica{fixture.Replica("v1-r-a", "node-1")}, now.Add(2 * time.Second), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			volume := "v1"
			if tc.name == "another volume is not held" {
				volume = "v2"
			}
			assert.Equal(t, tc.want, c.unseen(volume, tc.cached, tc.at))
		})
	}
	c.add("v1", "v1-r-b", now)
	assert.False(t, c.unseen("v1", nil, now.Add(createdReplicaExpiry+time.Second)), "an expired one no longer holds")
}

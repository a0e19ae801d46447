package controller

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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

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
	nodes := []runtime.Object{schedNode("node-1"), schedNode("node-2"), schedNode("node-3"),
		&v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingReplicaReplenishmentWaitInterval), Namespace: testNS}, Value: "60"}}
	leases := []runtime.Object{testLease("node-1", 0), testLease("node-2", 0), testLease("node-3", 0)}
	type check = func(t *testing.T, env *dstest.Env)
	volumeIs := func(state v1beta1.VolumeState, robustness v1beta1.VolumeRobustness, current string) check {
		return func(t *testing.T, env *dstest.Env) {
			v, err := env.Strata.StrataV1beta1().Volumes(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, state, v.Status.State, "state")
			assert.Equal(t, robustness, v.Status.Robustness, "robustness")
			assert.Equal(t, current, v.Status.CurrentNodeID, "currentNodeID")
		}
	}
	engineIs := func(node string, desire v1beta1.InstanceState, replicas ...string) check {
		return func(t *testing.T, env *dstest.Env) {
			e, err := env.Strata.StrataV1beta1().Engines(testNS).Get(context.Background(), "v1-e-0", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, node, e.Spec.NodeID)
			assert.Equal(t, desire, e.Spec.DesireState)
			assert.ElementsMatch(t, replicas, slices.Sorted(maps.Keys(e.Spec.ReplicaAddressMap)))
		}
	}
	replicaIs := func(name string, desire v1beta1.InstanceState, failed bool) check {
		return func(t *testing.T, env *dstest.Env) {
			r, err := env.Strata.StrataV1beta1().Replicas(testNS).Get(context.Background(), name, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, desire, r.Spec.DesireState, "desireState of "+name)
			assert.Equal(t, failed, r.Spec.FailedAt != "", "failed "+name)
		}
	}
	tests := []syncCase{
		{
			name:    "new volume gets an engine and three replicas on three nodes",
			objects: []runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Status = v1beta1.VolumeStatus{OwnerID: "node-1"} })},
			wantWrites: []string{"create engines v1-e-", "create replicas v1-r-", "create replicas v1-r-", "create replicas v1-r-",
				"update volumes/status v1"},
			wantEvents: []string{"Normal ReplicaScheduled", "Normal ReplicaScheduled", "Normal ReplicaScheduled"},
			check: allChecks(volumeIs(v1beta1.VolumeStateDetached, v1beta1.VolumeRobustnessHealthy, ""),
				func(t *testing.T, env *dstest.Env) {
					reps, err := env.Strata.StrataV1beta1().Replicas(testNS).List(context.Background(), metav1.ListOptions{})
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
			name:       "volume without the finalizer gets it first",
			objects:    []runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Finalizers = nil })},
			wantWrites: []string{"update volumes v1"},
		},
		{
			name:       "not responsible: another node owns the volume",
			objects:    append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Status.OwnerID = "node-2" }), vcEngine()}, threeReplicas()...),
			wantWrites: nil,
		},
		{
			name: "spec.nodeID set: replicas start first, state attaching",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Spec.NodeID = "node-2" }), vcEngine()},
				threeReplicas()...),
			wantWrites: []string{"update replicas r1", "update replicas r2", "update replicas r3", "update volumes/status v1"},
			check: allChecks(volumeIs(v1beta1.VolumeStateAttaching, v1beta1.VolumeRobustnessHealthy, ""),
				replicaIs("r1", v1beta1.InstanceStateRunning, false), engineIs("", v1beta1.InstanceStateStopped)),
		},
		{
			name: "replicas running: engine asked to run on the node with them",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.State = "node-2", v1beta1.VolumeStateAttaching
			}), vcEngine()}, threeReplicas(replicaRunning)...),
			wantWrites: []string{"update engines v1-e-0", "update volumes/status v1"},
			check: allChecks(volumeIs(v1beta1.VolumeStateAttaching, v1beta1.VolumeRobustnessHealthy, ""),
				engineIs("node-2", v1beta1.InstanceStateRunning, "r1", "r2", "r3")),
		},
		{
			name: "engine running with its endpoint: attached, currentNodeID set",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.State, v.Status.OwnerID = "node-2", v1beta1.VolumeStateAttaching, "node-2"
			}), vcEngine(engineRunningOn("node-2", allRW()))}, threeReplicas(replicaRunning)...),
			wantWrites: []string{"update volumes/status v1"},
			wantEvents: []string{"Normal Attached"},
			check:      allChecks(volumeIs(v1beta1.VolumeStateAttached, v1beta1.VolumeRobustnessHealthy, "node-2")),
		},
		{
			name: "engine marks a replica ERR: replica failed and stopped, volume degraded",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.Spec.NodeID, v.Status.State, v.Status.CurrentNodeID, v.Status.OwnerID = "node-2", v1beta1.VolumeStateAttached, "node-2", "node-2"
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW,
				"r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeERR}))}, threeReplicas(replicaRunning)...),
			wantWrites: []string{"update replicas r3", "update engines v1-e-0", "update volumes/status v1"},
			wantEvents: []string{"Warning ReplicaFailed", "Warning Degraded"},
			check: allChecks(volumeIs(v1beta1.VolumeStateAttached, v1beta1.VolumeRobustnessDegraded, "node-2"),
				replicaIs("r3", v1beta1.InstanceStateStopped, true), engineIs("node-2", v1beta1.InstanceStateRunning, "r1", "r2")),
		},
		{
			name: "actualSize follows the chain the engine reports",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2")),
				vcEngine(engineRunningOn("node-2", allRW()), headHolding(72<<20))}, threeReplicas(replicaRunning)...),
			wantWrites: []string{"update volumes/status v1"},
			check: func(t *testing.T, env *dstest.Env) {
				v, err := env.Strata.StrataV1beta1().Volumes(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.EqualValues(t, 72<<20, v.Status.ActualSize)
				assert.EqualValues(t, 72<<20, v.Status.HeadSize)
				assert.Zero(t, v.Status.SnapshotsSize+v.Status.RemovedSnapshotsSize)
			},
		},
		{
			name: "actualSize already reported: nothing to write",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) { v.Status.ActualSize, v.Status.HeadSize = 72<<20, 72<<20 }),
				vcEngine(engineRunningOn("node-2", allRW()), headHolding(72<<20))}, threeReplicas(replicaRunning)...),
			wantWrites: nil,
		},
		{
			name: "failed replica within the wait interval is not replaced yet",
			me:   "node-2",
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				vcReplica("r1", "node-1", replicaRunning), vcReplica("r2", "node-2", replicaRunning), vcReplica("r3", "node-3", failedAgo(30*time.Second))},
			wantWrites: nil,
		},
		{
			name: "a replica on a node whose manager is down stays while the running engine has it RW",
			me:   "node-2",
			kube: []runtime.Object{testLease("node-1", 0), testLease("node-2", 0), testLease("node-3", time.Hour)},
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessHealthy
			}), vcEngine(engineRunningOn("node-2", allRW())),
				vcReplica("r1", "node-1", replicaRunning), vcReplica("r2", "node-2", replicaRunning), vcReplica("r3", "node-3", replicaRunning)},
		},
		{
			name: "a replica on a down node the engine does not have RW is failed",
			me:   "node-2",
			kube: []runtime.Object{testLease("node-1", 0), testLease("node-2", 0), testLease("node-3", time.Hour)},
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessHealthy
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeWO})),
				vcReplica("r1", "node-1", replicaRunning), vcReplica("r2", "node-2", replicaRunning), vcReplica("r3", "node-3", replicaRunning)},
			wantWrites: []string{"update replicas r3", "update engines v1-e-0", "update volumes/status v1"},
			wantEvents: []string{"Warning ReplicaFailed", "Warning Degraded"},
		},
		{
			name: "a failed replica whose node, instance manager and disk are back is reused within the wait",
			me:   "node-2",
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				vcReplica("r1", "node-1", replicaRunning), vcReplica("r2", "node-2", replicaRunning), vcReplica("r3", "node-3", failedAgo(30*time.Second)),
				readyDiskNode("node-3")},
			wantWrites: []string{"update replicas r3", "update replicas r3"},
			wantEvents: []string{"Normal ReplicaReused"},
			check: func(t *testing.T, env *dstest.Env) {
				r, err := env.Strata.StrataV1beta1().Replicas(testNS).Get(context.Background(), "r3", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Empty(t, r.Spec.FailedAt)
				assert.Empty(t, r.Spec.HealthyAt, "it is rebuilt before it counts as holding the data")
				assert.Equal(t, v1beta1.InstanceStateRunning, r.Spec.DesireState)
				assert.Equal(t, "1", r.Annotations[annotationReuseAttempts])
			},
		},
		{
			name: "a failed replica reused too often is left to be replaced",
			me:   "node-2",
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				vcReplica("r1", "node-1", replicaRunning), vcReplica("r2", "node-2", replicaRunning),
				vcReplica("r3", "node-3", failedAgo(30*time.Second), func(r *v1beta1.Replica) {
					r.Annotations = map[string]string{annotationReuseAttempts: "3"}
				}),
				readyDiskNode("node-3")},
		},
		{
			name: "the only free node's instance manager is down: no replica there, Scheduled=False names it",
			me:   "node-2",
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeRW})),
				vcReplica("r1", "node-1", failedAgo(2*time.Minute)), vcReplica("r2", "node-2", replicaRunning), vcReplica("r3", "node-3", replicaRunning),
				&v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: testNS},
					Spec:   v1beta1.InstanceManagerSpec{NodeID: "node-1"},
					Status: v1beta1.InstanceManagerStatus{CurrentState: v1beta1.InstanceStateError}}},
			wantWrites: []string{"delete replicas r1", "update volumes/status v1"},
			wantEvents: []string{"Warning ReplicaUnschedulable"},
			check: allChecks(func(t *testing.T, env *dstest.Env) {
				v, err := env.Strata.StrataV1beta1().Volumes(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				c := FindCondition(v.Status.Conditions, v1beta1.VolumeConditionScheduled)
				require.NotNil(t, c)
				assert.Equal(t, metav1.ConditionFalse, c.Status)
				assert.Contains(t, c.Message, "node-1: instance manager im-node-1 is error")
			}),
		},
		{
			name: "failed replica past the wait interval is replaced by a new one that starts",
			me:   "node-2",
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), func(v *v1beta1.Volume) {
				v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
			}), vcEngine(engineRunningOn("node-2", map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW})),
				vcReplica("r1", "node-1", replicaRunning), vcReplica("r2", "node-2", replicaRunning), vcReplica("r3", "node-3", failedAgo(2*time.Minute))},
			wantWrites: []string{"delete replicas r3", "create replicas v1-r-", "update volumes/status v1"},
			wantEvents: []string{"Normal ReplicaScheduled"},
			check: allChecks(func(t *testing.T, env *dstest.Env) {
				reps, err := env.Strata.StrataV1beta1().Replicas(testNS).List(context.Background(), metav1.ListOptions{})
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
			name: "spec.nodeID cleared: engine stops first, currentNodeID kept while detaching",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.Status.State, v.Status.CurrentNodeID, v.Status.OwnerID = v1beta1.VolumeStateAttached, "node-2", "node-2"
			}), vcEngine(engineRunningOn("node-2", allRW()))}, threeReplicas(replicaRunning)...),
			wantWrites: []string{"update engines v1-e-0", "update volumes/status v1"},
			check: allChecks(volumeIs(v1beta1.VolumeStateDetaching, v1beta1.VolumeRobustnessHealthy, "node-2"),
				engineIs("node-2", v1beta1.InstanceStateStopped, "r1", "r2", "r3")),
		},
		{
			name: "engine and replicas stopped: detached, currentNodeID cleared",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.Status.State, v.Status.CurrentNodeID = v1beta1.VolumeStateDetaching, "node-2"
			}), vcEngine(func(e *v1beta1.Engine) { e.Spec.NodeID = "node-2" })}, threeReplicas()...),
			wantWrites: []string{"update volumes/status v1"},
			wantEvents: []string{"Normal Detached"},
			check:      allChecks(volumeIs(v1beta1.VolumeStateDetached, v1beta1.VolumeRobustnessHealthy, "")),
		},
		{
			name: "every replica failed: faulted, detached, the latest to fail are salvaged",
			objects: []runtime.Object{vcVolume(), vcEngine(),
				vcReplica("r1", "node-1", failedAgo(10*time.Minute)), vcReplica("r2", "node-2", failedAgo(time.Minute)),
				vcReplica("r3", "node-3", failedAgo(time.Minute+10*time.Second))},
			// The decision is recorded before the replicas change.
			wantWrites: []string{"update volumes/status v1", "update replicas r2", "update replicas r3", "update volumes/status v1"},
			wantEvents: []string{"Warning Salvaged", "Warning Degraded"},
			check: allChecks(replicaIs("r1", v1beta1.InstanceStateStopped, true), replicaIs("r2", v1beta1.InstanceStateStopped, false),
				replicaIs("r3", v1beta1.InstanceStateStopped, false)),
		},
		{
			name: "grown while detached: replicas open at the new size, then the size is recorded",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Spec.Size = resource.MustParse("2Gi") }), vcEngine()},
				threeReplicas(replicaRunning, func(r *v1beta1.Replica) { r.Spec.VolumeSize = 2 * gib })...),
			wantWrites: []string{"update volumes/status v1"},
			wantEvents: []string{"Normal Expanded"},
			check: allChecks(func(t *testing.T, env *dstest.Env) {
				v, err := env.Strata.StrataV1beta1().Volumes(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, 2*gib, v.Status.CurrentSize)
			}),
		},
		{
			name: "deleting: engine and replicas are deleted, the finalizer stays until they are gone",
			objects: append([]runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
			}), vcEngine()}, threeReplicas()...),
			wantWrites: []string{"delete engines v1-e-0", "delete replicas r1", "delete replicas r2", "delete replicas r3", "update volumes/status v1"},
		},
		{
			name: "deleting with nothing left: the finalizer goes",
			objects: []runtime.Object{vcVolume(func(v *v1beta1.Volume) {
				v.DeletionTimestamp = &metav1.Time{Time: dstest.Now}
			})},
			wantWrites: []string{"update volumes v1"},
		},
		{
			name:       "replica create fails: the error is returned for a retry",
			objects:    []runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Status = v1beta1.VolumeStatus{OwnerID: "node-1"} })},
			apiErr:     &reactorError{"create", "replicas", "", errors.New("etcd is down")},
			wantErr:    "etcd is down",
			wantWrites: []string{"create engines v1-e-", "create replicas v1-r-", "update volumes/status v1"},
		},
	}
	for i := range tests {
		// A case may bring its own version of a node.
		own := map[string]bool{}
		for _, o := range tests[i].objects {
			if n, ok := o.(*v1beta1.Node); ok {
				own[n.Name] = true
			}
		}
		for _, o := range nodes {
			if n, ok := o.(*v1beta1.Node); !ok || !own[n.Name] {
				tests[i].objects = append(tests[i].objects, o)
			}
		}
		if tests[i].kube == nil {
			tests[i].kube = leases
		}
	}
	runSyncCases(t, tests, volumeSyncer)
}

// volumeSyncer builds the volume controller's sync for runSyncCases.
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
		{"in the cache", []*v1beta1.Replica{vcReplica("v1-r-a", "node-1")}, now.Add(2 * time.Second), false},
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

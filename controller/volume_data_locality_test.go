package controller

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// dataLocality (best-effort) keeps a replica where the volume is attached:
// one is added there once the others hold the data, and a replica
// elsewhere goes once it holds the data too. Otherwise nothing moves.
func TestVolumeDataLocality(t *testing.T) {
	bestEffort := func(v *v1beta1.Volume) { v.Spec.DataLocality = v1beta1.DataLocalityBestEffort }
	oneReplica := func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 1 }
	rw := func(names ...string) map[string]v1beta1.ReplicaMode {
		m := map[string]v1beta1.ReplicaMode{}
		for _, n := range names {
			m[n] = v1beta1.ReplicaModeRW
		}
		return m
	}
	rebuilding := func(r *v1beta1.Replica) { r.Spec.HealthyAt = "" }
	// newest: without locality the newest replica is the one trimmed.
	newest := func(r *v1beta1.Replica) { r.CreationTimestamp = metav1.NewTime(dstest.Now.Add(-time.Minute)) }
	nodes := []runtime.Object{schedNode("node-1"), schedNode("node-2"), schedNode("node-3")}
	nodesOfReplicas := func(t *testing.T, env *dstest.Env) []string {
		reps, err := env.Strata.StrataV1beta1().Replicas(testNS).List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		var on []string
		for _, r := range reps.Items {
			on = append(on, r.Spec.NodeID)
		}
		return on
	}
	replicaOn := func(node string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) { assert.Contains(t, nodesOfReplicas(t, env), node) }
	}
	noReplicaOn := func(node string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) { assert.NotContains(t, nodesOfReplicas(t, env), node) }
	}
	tests := []syncCase{
		{
			name: "attached where no replica is: one is added there",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2"), oneReplica, bestEffort),
				vcEngine(engineRunningOn("node-2", rw("r1"))), vcReplica("r1", "node-1", replicaRunning)}, nodes...),
			wantWrites: []string{"create replicas v1-r-", "update volumes/status v1"},
			wantEvents: []string{"Normal ReplicaScheduled"},
			check:      replicaOn("node-2"),
		},
		{
			name: "the local replica rebuilds: nothing is trimmed yet",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2"), oneReplica, bestEffort),
				vcEngine(engineRunningOn("node-2", rw("r1"))), vcReplica("r1", "node-1", replicaRunning),
				vcReplica("r2", "node-2", replicaRunning, rebuilding)}, nodes...),
			wantWrites: []string{"update engines v1-e-0"}, // the engine takes r2 in to rebuild it
			check: func(t *testing.T, env *dstest.Env) {
				_, err := env.Strata.StrataV1beta1().Replicas(testNS).Get(context.Background(), "r1", metav1.GetOptions{})
				require.NoError(t, err, "r1 stays while r2 rebuilds")
			},
		},
		{
			name: "the local replica holds the data: the other one goes",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2"), oneReplica, bestEffort),
				vcEngine(engineRunningOn("node-2", rw("r1", "r2"))), vcReplica("r1", "node-1", replicaRunning),
				vcReplica("r2", "node-2", replicaRunning, newest)}, nodes...),
			wantWrites: []string{"delete replicas r1", "update engines v1-e-0"},
			wantEvents: []string{"Normal ReplicaMadeLocal"},
		},
		{
			name: "disabled: the replica stays where it is",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2"), oneReplica),
				vcEngine(engineRunningOn("node-2", rw("r1"))), vcReplica("r1", "node-1", replicaRunning)}, nodes...),
			wantWrites: nil,
		},
		{
			name: "a replica elsewhere still rebuilds: nothing is added",
			me:   "node-2",
			objects: append([]runtime.Object{vcVolume(attachedOn("node-2"), bestEffort, func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 2 }),
				vcEngine(engineRunningOn("node-2", rw("r1"))), vcReplica("r1", "node-1", replicaRunning),
				vcReplica("r3", "node-3", replicaRunning, rebuilding)}, nodes...),
			// the engine takes r3 in to rebuild it; the volume is degraded meanwhile
			wantWrites: []string{"update engines v1-e-0", "update volumes/status v1"},
			wantEvents: []string{"Warning Degraded"},
			check:      noReplicaOn("node-2"),
		},
		{
			name: "the attached node has no disk: best effort, nothing changes",
			me:   "node-2",
			objects: []runtime.Object{vcVolume(attachedOn("node-2"), oneReplica, bestEffort),
				vcEngine(engineRunningOn("node-2", rw("r1"))), vcReplica("r1", "node-1", replicaRunning),
				schedNode("node-1"), testNode("node-2", nil, readyTrue()), schedNode("node-3")},
			wantWrites: nil,
		},
		{
			name: "detached: nothing moves",
			objects: append([]runtime.Object{vcVolume(oneReplica, bestEffort, withinSnapshotLimits), vcEngine(),
				vcReplica("r1", "node-3")}, nodes...),
			wantWrites: nil,
		},
	}
	runSyncCases(t, tests, volumeSyncer)
}

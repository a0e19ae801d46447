package volume

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/controller/fixture"
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
	nodes := []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3")}
	nodesOfReplicas := func(t *testing.T, env *dstest.Env) []string {
		reps, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).List(context.Background(), metav1.ListOptions{})
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
	tests := []fixture.SyncCase{
		{
			Name: "attached where no replica is: one is added there",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), oneReplica, bestEffort),
				fixture.Engine(fixture.EngineRunningOn("node-2", rw("r1"))), fixture.Replica("r1", "node-1", fixture.ReplicaRunning)}, nodes...),
			WantWrites: []string{"create replicas v1-r-", "update volumes/status v1"},
			WantEvents: []string{"Normal ReplicaScheduled"},
			Check:      replicaOn("node-2"),
		},
		{
			Name: "the local replica rebuilds: nothing is trimmed yet",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), oneReplica, bestEffort),
				fixture.Engine(fixture.EngineRunningOn("node-2", rw("r1"))), fixture.Replica("r1", "node-1", fixture.ReplicaRunning),
				fixture.Replica("r2", "node-2", fixture.ReplicaRunning, rebuilding)}, nodes...),
			WantWrites: []string{"update engines v1-e-0"}, // the engine takes r2 in to rebuild it
			Check: func(t *testing.T, env *dstest.Env) {
				_, err := env.Strata.StrataV1beta1().Replicas(fixture.NS).Get(context.Background(), "r1", metav1.GetOptions{})
				require.NoError(t, err, "r1 stays while r2 rebuilds")
			},
		},
		{
			Name: "the local replica holds the data: the other one goes",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), oneReplica, bestEffort),
				fixture.Engine(fixture.EngineRunningOn("node-2", rw("r1", "r2"))), fixture.Replica("r1", "node-1", fixture.ReplicaRunning),
				fixture.Replica("r2", "node-2", fixture.ReplicaRunning, newest)}, nodes...),
			WantWrites: []string{"delete replicas r1", "update engines v1-e-0"},
			WantEvents: []string{"Normal ReplicaMadeLocal"},
		},
		{
			Name: "disabled: the replica stays where it is",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), oneReplica),
				fixture.Engine(fixture.EngineRunningOn("node-2", rw("r1"))), fixture.Replica("r1", "node-1", fixture.ReplicaRunning)}, nodes...),
			WantWrites: nil,
		},
		{
			Name: "a replica elsewhere still rebuilds: nothing is added",
			Me:   "node-2",
			Objects: append([]runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), bestEffort, func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 2 }),
				fixture.Engine(fixture.EngineRunningOn("node-2", rw("r1"))), fixture.Replica("r1", "node-1", fixture.ReplicaRunning),
				fixture.Replica("r3", "node-3", fixture.ReplicaRunning, rebuilding)}, nodes...),
			// the engine takes r3 in to rebuild it; the volume is degraded meanwhile
			WantWrites: []string{"update engines v1-e-0", "update volumes/status v1"},
			WantEvents: []string{"Warning Degraded"},
			Check:      noReplicaOn("node-2"),
		},
		{
			Name: "the attached node has no disk: best effort, nothing changes",
			Me:   "node-2",
			Objects: []runtime.Object{fixture.Volume(fixture.AttachedOn("node-2"), oneReplica, bestEffort),
				fixture.Engine(fixture.EngineRunningOn("node-2", rw("r1"))), fixture.Replica("r1", "node-1", fixture.ReplicaRunning),
				fixture.SchedNode("node-1"), fixture.Node("node-2", nil, fixture.ReadyTrue()), fixture.SchedNode("node-3")},
			WantWrites: nil,
		},
		{
			Name: "detached: nothing moves",
			Objects: append([]runtime.Object{fixture.Volume(oneReplica, bestEffort, fixture.WithinSnapshotLimits), fixture.Engine(),
				fixture.Replica("r1", "node-3")}, nodes...),
			WantWrites: nil,
		},
	}
	fixture.RunSyncCases(t, tests, volumeSyncer)
}

package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A 1-replica volume with dataLocality best-effort, attached on a node its
// replica is not on, ends with its one replica there: one is added and
// rebuilt where the engine runs, the other removed, and the data written
// before is all there. The manager that owns the volume is killed (-9) as
// the local replica appears, in the middle of the move.
func TestDataLocalityMovesTheReplicaWhereTheVolumeIsAttached(t *testing.T) {
	waitDataPlanesRunning(t)
	createVolume(t, "e2e-local", "64Mi", 1, func(v *v1beta1.Volume) { v.Spec.DataLocality = v1beta1.DataLocalityBestEffort })
	var first v1beta1.Replica
	require.Eventually(t, func() bool {
		reps := replicasOf(t, "e2e-local")
		if len(reps) == 1 && reps[0].Spec.NodeID != "" {
			first = reps[0]
		}
		return first.Name != ""
	}, time.Minute, 250*time.Millisecond, "the volume's replica is scheduled")
	attach := "node-1"
	if first.Spec.NodeID == attach {
		attach = "node-2"
	}
	updateTickets(t, "e2e-local", addTicket("admin", v1beta1.AttacherTypeStrataAPI, attach))
	v := waitVolume(t, "e2e-local", 2*time.Minute, "attached to "+attach, servedOn(attach))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x5a 0 24M", "write -P 0xa5 40M 8M")

	var local v1beta1.Replica
	require.Eventually(t, func() bool {
		for _, r := range replicasOf(t, "e2e-local") {
			if r.Spec.NodeID == attach {
				local = r
			}
		}
		return local.Name != ""
	}, time.Minute, 100*time.Millisecond, "a replica is added on %s", attach)
	owner := getVolume(t, "e2e-local").Status.OwnerID
	mgr := env.managers[owner]
	require.NoError(t, mgr.Kill())
	m, err := mgr.Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[owner] = m

	waitVolume(t, "e2e-local", 3*time.Minute, "its one replica on "+attach, func(*v1beta1.Volume) bool {
		reps := replicasOf(t, "e2e-local")
		return len(reps) == 1 && reps[0].Spec.NodeID == attach && reps[0].Spec.HealthyAt != "" && reps[0].DeletionTimestamp == nil
	})
	msg := waitEventIn(t, ns, "Volume", "e2e-local", "ReplicaMadeLocal", []string{first.Name, first.Spec.NodeID, attach}, time.Minute)
	t.Logf("event: %s", msg)
	v = waitVolume(t, "e2e-local", time.Minute, "healthy", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy
	})
	out := qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x5a 0 24M", "read -P 0 24M 16M", "read -P 0xa5 40M 8M")
	assert.NotContains(t, out, "Pattern verification failed")
	assert.Equal(t, local.Name, replicasOf(t, "e2e-local")[0].Name, "the replica kept is the one added on %s", attach)
}

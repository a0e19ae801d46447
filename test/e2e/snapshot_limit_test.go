package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Issue 14, per-volume snapshot limits, end to end: a volume at its count
// limit refuses the next user snapshot with a clear error, while rebuilds,
// which take system snapshots, still succeed on it (even with every
// replica rebuilt, the limit holds); lowering the limit below what the
// volume holds is denied with the figure; raising it lets the next
// snapshot through.
func TestSnapshotLimitRefusesUserSnapshotsNotRebuilds(t *testing.T) {
	const vol = "e2e-lim"
	snap := func(i int) string { return fmt.Sprintf("e2e-lim-%d", i) }
	created := createVolume(t, vol, "16Mi", 2, func(v *v1beta1.Volume) { v.Spec.SnapshotMaxCount = 2 })
	require.Equal(t, int32(2), created.Spec.SnapshotMaxCount)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, time.Minute, "attached", attachedTo("node-1"))
	ep := v.Status.FrontendEndpoint

	// Two user snapshots, each over its own data.
	qemuIO(t, ep, "write -P 0x11 0 1M")
	createSnapshot(t, vol, snap(1))
	waitSnapshotsReady(t, vol, 1, time.Minute)
	qemuIO(t, ep, "write -P 0x22 1M 1M")
	createSnapshot(t, vol, snap(2))
	waitSnapshotsReady(t, vol, 2, time.Minute)
	qemuIO(t, ep, "write -P 0x33 2M 1M")
	waitSnapshotLimitCondition(t, vol, "CountLimitReached", "2 of 2 user snapshots (spec.snapshotMaxCount)")

	// The third is refused: kubectl shows it not ready, and why.
	createSnapshot(t, vol, snap(3))
	waitRefused(t, snap(3))
	assert.Regexp(t, `e2e-lim-3\s+e2e-lim\s+false`, kubectl(t, "-n", ns, "get", "snap", snap(3)))
	msg := kubectl(t, "-n", ns, "get", "snap", snap(3), "-o", "jsonpath={.status.error}")
	assert.Contains(t, msg, "snapshot limit exceeded: volume e2e-lim holds 2 of at most 2 user snapshots (spec.snapshotMaxCount)")
	assert.Contains(t, msg, "delete snapshots or raise the limit")
	waitEventIn(t, ns, "Snapshot", snap(3), "SnapshotFailed", []string{"spec.snapshotMaxCount"}, 30*time.Second)
	waitEventIn(t, ns, "Volume", vol, "SnapshotLimit", []string{"2 of 2 user snapshots"}, 30*time.Second)

	// Lose each original replica in turn: every rebuild takes a system
	// snapshot on the volume at its limit, and succeeds.
	originals := replicasOf(t, vol)
	require.Len(t, originals, 2)
	for _, r := range originals {
		require.NoError(t, deleteReplica(r.Name))
		waitRebuilt(t, vol, r.Name)
		qemuIO(t, ep, "read -P 0x11 0 1M", "read -P 0x22 1M 1M", "read -P 0x33 2M 1M")
	}
	rebuilds := 0
	for name, info := range engineChain(t, vol) {
		if strings.HasPrefix(name, "rebuild-") {
			assert.False(t, info.UserCreated, "%s is a system snapshot", name)
			rebuilds++
		}
	}
	assert.Equal(t, 2, rebuilds, "one system snapshot per rebuild")
	// Only rebuilt replicas are left: they enforce the limit as well.
	createSnapshot(t, vol, snap(4))
	waitRefused(t, snap(4))

	// The refused requests are the admin's to drop.
	kubectl(t, "-n", ns, "delete", "snap", snap(3), snap(4), "--timeout=60s")

	// A size limit under twice the volume is denied, naming the field.
	out, err := tryKubectl(t, "-n", ns, "patch", "vol", vol, "--type=merge", "-p", `{"spec":{"snapshotMaxSize":"16Mi"}}`)
	require.Error(t, err)
	assert.Contains(t, out, "spec.snapshotMaxSize: 16Mi is less than twice spec.size 16Mi; set at least 32Mi, or 0 for no limit")

	// Raised: the running engine takes the new limit, the next snapshot passes.
	kubectl(t, "-n", ns, "patch", "vol", vol, "--type=merge", "-p", `{"spec":{"snapshotMaxCount":3}}`)
	waitEngineLimit(t, vol, 3)
	createSnapshot(t, vol, snap(5))
	require.Eventually(t, func() bool { return getSnapshot(t, snap(5)).Status.ReadyToUse }, time.Minute, 200*time.Millisecond,
		"%s taken under the raised limit", snap(5))
	assert.Empty(t, getSnapshot(t, snap(5)).Status.Error)
	waitSnapshotLimitCondition(t, vol, "CountLimitReached", "3 of 3 user snapshots (spec.snapshotMaxCount)")

	// Lowered below the three the volume holds: denied with the figure.
	out, err = tryKubectl(t, "-n", ns, "patch", "vol", vol, "--type=merge", "-p", `{"spec":{"snapshotMaxCount":2}}`)
	require.Error(t, err)
	assert.Contains(t, out, "spec.snapshotMaxCount: cannot lower to 2: the volume holds 3 user snapshots; delete 1 of them first")
	assert.Equal(t, int32(3), getVolume(t, vol).Spec.SnapshotMaxCount)

	qemuIO(t, ep, "read -P 0x11 0 1M", "read -P 0x22 1M 1M", "read -P 0x33 2M 1M")
	updateTickets(t, vol, removeTicket("admin"))
	waitVolume(t, vol, time.Minute, "detached", isDetached)
}

func getSnapshot(t *testing.T, name string) *v1beta1.Snapshot {
	t.Helper()
	s, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return s
}

// waitEngineLimit waits until the volume's running engine reports the
// count limit set on it.
func waitEngineLimit(t *testing.T, volume string, n int32) {
	t.Helper()
	var last *v1beta1.EngineSnapshotLimits
	ok := assert.Eventually(t, func() bool {
		engines := enginesOf(t, volume)
		if len(engines) != 1 {
			return false
		}
		last = engines[0].Status.SnapshotLimits
		return last != nil && last.MaxCount == n
	}, time.Minute, 200*time.Millisecond)
	require.True(t, ok, "engine of %s given a count limit of %d; last %+v", volume, n, last)
}

// waitRefused waits until the snapshot's status says the volume's limits
// refused it.
func waitRefused(t *testing.T, name string) {
	t.Helper()
	var last v1beta1.SnapshotStatus
	ok := assert.Eventually(t, func() bool {
		last = getSnapshot(t, name).Status
		return strings.HasPrefix(last.Error, v1beta1.SnapshotLimitExceeded) && !last.ReadyToUse
	}, time.Minute, 200*time.Millisecond)
	require.True(t, ok, "snapshot %s refused for the limit; last status %+v", name, last)
}

// waitSnapshotLimitCondition waits for the volume's SnapshotLimit
// condition to be True with the reason and a message holding want.
func waitSnapshotLimitCondition(t *testing.T, volume, reason, want string) {
	t.Helper()
	waitVolume(t, volume, time.Minute, "SnapshotLimit "+reason, func(v *v1beta1.Volume) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, "SnapshotLimit")
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == reason && strings.Contains(c.Message, want)
	})
}

// waitRebuilt waits until the volume, which lost replica gone, is healthy
// again on as many replicas as it asks for, each RW in its engine.
func waitRebuilt(t *testing.T, volume, gone string) {
	t.Helper()
	waitVolume(t, volume, 2*time.Minute, "rebuilt without "+gone, func(v *v1beta1.Volume) bool {
		if v.Status.Robustness != v1beta1.VolumeRobustnessHealthy {
			return false
		}
		reps := replicasOf(t, volume)
		engines := enginesOf(t, volume)
		if len(reps) != int(v.Spec.NumberOfReplicas) || len(engines) != 1 {
			return false
		}
		modes := engines[0].Status.ReplicaModeMap
		for _, r := range reps {
			if r.Name == gone || modes[r.Name] != v1beta1.ReplicaModeRW {
				return false
			}
		}
		return len(modes) == len(reps)
	})
}

package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A volume cloned from a snapshot, with the manager that owns the clone
// killed with SIGKILL in the middle of the copy: the copy starts over (the
// instance manager cancels the dead manager's call, the data plane zeroes
// the half-filled target) or, if it had ended, its outcome is read by the
// next owner; the clone completes with exactly the snapshot's data, and no
// clone ticket is left on either volume. In the long tier: make test's
// clones are test/deployed's (TestUserFlows/BackingImageClaimAndItsClone),
// and its manager kills are the other process-mode tests'.
func TestLongCloneSurvivesManagerKill(t *testing.T) {
	createVolume(t, "e2e-clsrc", "512Mi", 1)
	waitVolume(t, "e2e-clsrc", time.Minute, "detached", isDetached)
	useOn(t, "e2e-clsrc", "node-1", "write -P 0x5a 0 448M", "write -P 0xa5 448M 64M")
	createSnapshot(t, "e2e-clsrc", "e2e-clsrc-s1")
	waitSnapshotsReady(t, "e2e-clsrc", 1, 2*time.Minute)
	useOn(t, "e2e-clsrc", "node-1", "write -P 0x11 0 1M") // after the snapshot: not in the clone

	createVolume(t, "e2e-clone", "512Mi", 2, func(v *v1beta1.Volume) { v.Spec.DataSource = "snap://e2e-clsrc/e2e-clsrc-s1" })
	v := waitVolume(t, "e2e-clone", 2*time.Minute, "copying", func(v *v1beta1.Volume) bool {
		cs := v.Status.CloneStatus
		return cs != nil && cs.State == v1beta1.VolumeCloneStateCopying && cs.Progress > 0
	})
	require.Less(t, v.Status.CloneStatus.Progress, int32(100), "the kill must come in the middle of the copy")
	owner := v.Status.OwnerID
	mgr := env.managers[owner]
	require.NoError(t, mgr.Kill())
	t.Logf("killed %s's manager at %d%% of the copy", owner, v.Status.CloneStatus.Progress)
	restarted, err := mgr.Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[owner] = restarted

	v = waitVolume(t, "e2e-clone", 3*time.Minute, "clone completed", func(v *v1beta1.Volume) bool {
		cs := v.Status.CloneStatus
		require.NotEqual(t, v1beta1.VolumeCloneStateFailed, cs.State, "clone failed: %s", cs.Message)
		return cs.State == v1beta1.VolumeCloneStateCompleted && isDetached(v)
	})
	// Attempts is 2 when the kill cut the copy (the instance manager cancels
	// the dead manager's call and the next owner starts over); 1 when the
	// copy had already ended in the data plane (the progress the test saw
	// lags it; on a loaded machine the rest of a 512Mi copy takes less than
	// that lag), its outcome then read by the new owner. Either way the
	// clone must hold the snapshot's data and leave no ticket.
	assert.Positive(t, v.Status.CloneStatus.Attempts)
	t.Logf("clone completed after %d attempt(s)", v.Status.CloneStatus.Attempts)
	for _, vol := range []string{"e2e-clsrc", "e2e-clone"} {
		for id, tk := range getVA(t, vol).Spec.AttachmentTickets {
			assert.NotEqual(t, v1beta1.AttacherTypeVolumeCloneController, tk.Type, "volume %s keeps clone ticket %s", vol, id)
		}
	}
	useOn(t, "e2e-clone", "node-2", "read -P 0x5a 0 448M", "read -P 0xa5 448M 64M")
}

package attachment

import (
	"maps"
	"slices"
	"testing"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/assert"
)

// Until the restore completes only the restore controller's ticket may
// attach the volume; a workload's ticket says what it waits for.
func TestRestoreGatesTickets(t *testing.T) {
	tickets := map[string]*v1beta1.AttachmentTicket{
		"csi":     fixture.Ticket("csi", v1beta1.AttacherTypeCSIAttacher, "node-2"),
		"restore": fixture.Ticket("restore", v1beta1.AttacherTypeVolumeRestoreController, "node-1"),
	}
	restoring := fixture.RestoringVolume(restoreProgress(v1beta1.VolumeRestoreStateRestoring, 40))
	assert.Equal(t, []string{"restore"}, slices.Sorted(maps.Keys(eligibleTickets(restoring, tickets))))
	assert.Equal(t, TicketReasonWaitingForRestore, fillWaitReason(restoring))
	assert.Equal(t, "the volume is restored from backup b1 first; the restore is restoring (40%)", fillWaitMessage(restoring))
	done := fixture.RestoringVolume(restoreProgress(v1beta1.VolumeRestoreStateCompleted, 100))
	assert.Len(t, eligibleTickets(done, tickets), 2)
}

// restoreProgress is the restore status the restore controller writes.
func restoreProgress(state v1beta1.VolumeRestoreState, progress int32) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Status.RestoreStatus = &v1beta1.VolumeRestoreStatus{Backup: "b1", BackupVolume: "src", State: state, Progress: progress}
	}
}

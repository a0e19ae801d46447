package backup

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Emptied BackupVolumes (issue 23). The poll makes a BackupVolume for each
// volume its target holds backups of (backup_target_mirror.go); once the
// last of them was deleted, the BackupVolume went on naming a backup that
// was gone, forever. Now the same poll, after a complete listing, looks at
// each BackupVolume the listing does not name (backupVolumeFateOf):
//   - a Completed Backup CR that names the volume leaves it as it is: the
//     cluster knows backups of the volume, on another target maybe, whose
//     own poll fills the BackupVolume (every target's backups are mirrored
//     as Backups, created before their BackupVolume);
//   - another Backup (being taken, failed, being deleted) or the volume
//     itself keeps it, ready for the volume's next backup, but with no last
//     backup: kubectl get bv shows it empty rather than naming a deleted
//     backup;
//   - with none of these it is deleted, with an event on the BackupTarget;
//   - before either write the target is asked again about that volume
//     alone (VolumeHasBackups): a listing is one read of the whole target,
//     and a short one (an NFS hiccup) must cost nothing.
//
// Deleting one is never a loss: a BackupVolume is only the mirror's record
// (no finalizer, nothing on a target goes with it), and a poll that finds
// backups of the volume makes it again. The same listing decides creation
// and removal, so the two never fight; another target's backups keep it
// through their Completed Backups. A deleted Backup or volume brings the
// poll forward (enqueueIfBackupVolumeEmptied).

const EventReasonBackupVolumeRemoved = "BackupVolumeRemoved"

// backupVolumeFate is what becomes of the BackupVolume of a volume whose
// backups the target no longer lists.
type backupVolumeFate struct {
	// asIs: a Completed Backup names the volume; the BackupVolume is left alone.
	asIs bool
	// hold says what keeps it, shown empty; "" (and not asIs): it goes.
	hold string
}

// decideBackupVolume is the fate of a volume's BackupVolume from the
// Backups that name the volume and the volume (nil when deleted). Pure, so
// it is table-tested.
func decideBackupVolume(backups []*v1beta1.Backup, vol *v1beta1.Volume) backupVolumeFate {
	var completed, others []string
	for _, b := range backups {
		if b.Status.State == v1beta1.BackupStateCompleted && b.DeletionTimestamp == nil {
			completed = append(completed, b.Name)
		} else {
			others = append(others, b.Name)
		}
	}
	switch {
	case len(completed) > 0:
		return backupVolumeFate{asIs: true, hold: "completed Backup " + sortedList(completed) + " names the volume"}
	case len(others) > 0:
		return backupVolumeFate{hold: "Backup " + sortedList(others) + " names the volume"}
	case vol != nil:
		return backupVolumeFate{hold: "the volume exists"}
	}
	return backupVolumeFate{}
}

func sortedList(names []string) string {
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// backupVolumeFateOf is decideBackupVolume for a volume, from the cache.
func (c *BackupTargetController) backupVolumeFateOf(volume string) (backupVolumeFate, error) {
	backups, err := c.DS.Backups.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		return backupVolumeFate{}, err
	}
	vol, err := c.DS.Volumes.GetRO(volume)
	if apierrors.IsNotFound(err) {
		vol, err = nil, nil
	}
	if err != nil {
		return backupVolumeFate{}, err
	}
	return decideBackupVolume(backups, vol), nil
}

// pruneBackupVolumes deals with the BackupVolumes a complete listing of
// bt's target does not name. A failure is logged and left to the next
// poll: it says nothing of the target's availability.
func (c *BackupTargetController) pruneBackupVolumes(ctx context.Context, bt *v1beta1.BackupTarget, tgt *backupstore.Target,
	listed []backupstore.BackupInfo) {
	onTarget := make(map[string]bool)
	for _, b := range listed {
		onTarget[b.Volume] = true
	}
	bvs, err := c.DS.BackupVolumes.ListRO(nil)
	if err != nil {
		c.Logger.WithError(err).Warn("Cannot list the backup volumes")
		return
	}
	for _, bv := range bvs {
		if onTarget[bv.Name] || bv.DeletionTimestamp != nil {
			continue
		}
		if err := c.pruneBackupVolume(ctx, bt, tgt, bv); err != nil {
			c.Logger.WithFields(logrus.Fields{"backupTarget": bt.Name, "backupVolume": bv.Name}).WithError(err).
				Warn("Cannot remove or empty a backup volume the target holds no backup of")
		}
	}
}

// pruneBackupVolume removes bv, or shows it empty, when the target holds
// no backup of its volume.
func (c *BackupTargetController) pruneBackupVolume(ctx context.Context, bt *v1beta1.BackupTarget, tgt *backupstore.Target,
	bv *v1beta1.BackupVolume) error {
	fate, err := c.backupVolumeFateOf(bv.Name)
	if err != nil || fate.asIs {
		return err
	}
	if fate.hold != "" && bv.Status.LastBackupName == "" {
		return nil // kept, and already empty: no call to the target
	}
	if has, err := tgt.VolumeHasBackups(ctx, bv.Name); err != nil || has {
		return err
	}
	if fate.hold != "" {
		return c.showBackupVolumeEmpty(ctx, bv, fate.hold)
	}
	deleted, err := c.DS.BackupVolumes.DeleteIfUID(ctx, bv.Name, bv.UID)
	if err != nil || !deleted {
		return err
	}
	c.Logger.WithFields(logrus.Fields{"backupTarget": bt.Name, "backupVolume": bv.Name}).
		Info("Backup volume removed: no backup, no Backup and no volume left")
	c.Recorder.Event(bt, corev1.EventTypeNormal, EventReasonBackupVolumeRemoved, fmt.Sprintf(
		"removed BackupVolume %s: the target holds no backup of it, no Backup names it, and the volume is deleted", bv.Name))
	return nil
}

// showBackupVolumeEmpty clears what a kept BackupVolume said of its last
// backup, which is gone.
func (c *BackupTargetController) showBackupVolumeEmpty(ctx context.Context, bvRO *v1beta1.BackupVolume, hold string) error {
	bv := bvRO.DeepCopy()
	st := &bv.Status
	st.Size, st.DataStored, st.LastBackupName, st.LastBackupAt = 0, 0, "", ""
	st.BackingImageName, st.BackingImageChecksum = "", ""
	c.Logger.WithFields(logrus.Fields{"backupVolume": bv.Name, "keptBecause": hold}).
		Info("Backup volume has no backup left on the target; kept")
	_, err := c.DS.BackupVolumes.UpdateStatus(ctx, bv)
	return err
}

// enqueueIfBackupVolumeEmptied brings every target's poll forward when the
// volume's BackupVolume is one the poll would remove or show empty (its
// last Backup or the volume was just deleted). Every target: a
// BackupVolume does not record which one holds its backups, and there is
// usually one.
func (c *BackupTargetController) enqueueIfBackupVolumeEmptied(volume string) {
	if volume == "" {
		return
	}
	bv, err := c.DS.BackupVolumes.GetRO(volume)
	if err != nil {
		return
	}
	fate, err := c.backupVolumeFateOf(volume)
	if err != nil || fate.asIs || (fate.hold != "" && bv.Status.LastBackupName == "") {
		return
	}
	for _, key := range c.DS.BackupTargets.Informer().GetStore().ListKeys() {
		c.Queue.Add(key)
	}
}

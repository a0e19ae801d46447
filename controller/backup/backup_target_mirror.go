package backup

import (
	"context"
	"fmt"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// mirrorBackups makes a BackupVolume per volume and a Backup per backup the
// target holds, and brings their status to what the manifests say. An
// object already right is not written. Nothing is deleted here: a backup
// missing from a listing is never taken for gone (a store's hiccup can
// return a short listing), and Backups being taken are the backup
// controller's. A BackupVolume nothing holds any more goes after the
// target was asked again (backup_volume_prune.go).
func (c *BackupTargetController) mirrorBackups(ctx context.Context, bt *v1beta1.BackupTarget, tgt *backupstore.Target,
	backups []backupstore.BackupInfo) error {
	// The listing is sorted by volume, then time: a volume's last entry is
	// its newest backup.
	for i, b := range backups {
		if err := c.mirrorBackup(ctx, bt, tgt, b); err != nil {
			return err
		}
		if i == len(backups)-1 || backups[i+1].Volume != b.Volume {
			if err := c.mirrorBackupVolume(ctx, b.Volume, b); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *BackupTargetController) mirrorBackup(ctx context.Context, bt *v1beta1.BackupTarget, tgt *backupstore.Target,
	b backupstore.BackupInfo) error {
	want := completedBackupStatus(bt.Spec.BackupTargetURL, b.Header)
	existing, err := c.DS.Backups.GetRO(b.Backup)
	if apierrors.IsNotFound(err) {
		// A Backup deleted while the listing was read would come back as a
		// ghost of a deleted manifest: the manifest goes before the CR's
		// finalizer, so asking again now leaves only a window of the two
		// API calls below.
		if there, err := tgt.HasBackup(ctx, b.Volume, b.Backup); err != nil || !there {
			return err
		}
		created, err := c.DS.Backups.Create(ctx, &v1beta1.Backup{
			ObjectMeta: metav1.ObjectMeta{Name: b.Backup, Namespace: c.DS.Namespace,
				Labels:      map[string]string{types.LabelVolume: b.Volume},
				Annotations: map[string]string{AnnotationBackupMirrored: "true"}},
			Spec: v1beta1.BackupSpec{SnapshotName: b.Snapshot, Labels: b.Labels}})
		if apierrors.IsAlreadyExists(err) {
			return nil // next poll
		}
		if err != nil {
			return err
		}
		existing = created
	} else if err != nil {
		return err
	}
	switch {
	case existing.Status.VolumeName != "" && existing.Status.VolumeName != b.Volume:
		c.Logger.WithFields(map[string]any{"backup": b.Backup, "volume": b.Volume, "crVolume": existing.Status.VolumeName}).
			Warn("A Backup CR of this name belongs to another volume; the target's backup is not mirrored")
		return nil
	case existing.Status.State != "" && existing.Status.State != v1beta1.BackupStateCompleted:
		return nil // being taken here: the backup controller's
	}
	want.OwnerID, want.LastSyncedAt, want.SnapshotCreatedAt = existing.Status.OwnerID, existing.Status.LastSyncedAt,
		existing.Status.SnapshotCreatedAt
	want.Verification = existing.Status.Verification // the backup controller's (backup_verify.go)
	if want.IncrementalOn == "" {
		want.IncrementalOn = existing.Status.IncrementalOn // from the job, for a manifest that names no base
	}
	if reflect.DeepEqual(existing.Status, want) {
		return nil
	}
	bk := existing.DeepCopy()
	bk.Status = want
	_, err = c.DS.Backups.UpdateStatus(ctx, bk)
	return err
}

// completedBackupStatus is the status of a Backup whose manifest h is on
// the target at url: the one function both the backup controller (when it
// made the backup) and the mirror (when it found it) write, so neither
// rewrites the other's. What the backup did (issue 23) stays in it for the
// Backup's life: the bytes it uploaded and its base. The caller keeps
// ownerID, lastSyncedAt, snapshotCreatedAt and verification, and an
// incrementalOn the manifest does not record.
func completedBackupStatus(url string, h backupstore.Header) v1beta1.BackupStatus {
	st := v1beta1.BackupStatus{State: v1beta1.BackupStateCompleted, Progress: 100,
		URL: url, SnapshotName: h.Snapshot, BackupCreatedAt: h.Created.UTC().Format(time.RFC3339),
		Size: h.Stats.StoredBytes, UploadedBytes: h.Stats.NewBytes, IncrementalOn: h.Base,
		Labels: h.Labels, VolumeName: h.Volume, VolumeSize: h.VolumeSize}
	if h.BackingImage != nil {
		st.VolumeBackingImageName = h.BackingImage.Name
		st.VolumeBackingImageURL, st.VolumeBackingImageChecksum = h.BackingImage.URL, h.BackingImage.Checksum
	}
	return st
}

func (c *BackupTargetController) mirrorBackupVolume(ctx context.Context, volume string, last backupstore.BackupInfo) error {
	existing, err := c.DS.BackupVolumes.GetRO(volume)
	if apierrors.IsNotFound(err) {
		existing, err = c.DS.BackupVolumes.Create(ctx, &v1beta1.BackupVolume{
			ObjectMeta: metav1.ObjectMeta{Name: volume, Namespace: c.DS.Namespace,
				Labels: map[string]string{types.LabelVolume: volume}}})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("backup volume %s: %w", volume, err)
	}
	want := existing.Status
	want.Size, want.LastBackupName = last.VolumeSize, last.Backup
	want.LastBackupAt = last.Created.UTC().Format(time.RFC3339)
	want.BackingImageName, want.BackingImageChecksum = "", ""
	if last.BackingImage != nil {
		want.BackingImageName, want.BackingImageChecksum = last.BackingImage.Name, last.BackingImage.Checksum
	}
	if reflect.DeepEqual(existing.Status, want) {
		return nil
	}
	bv := existing.DeepCopy()
	bv.Status = want
	_, err = c.DS.BackupVolumes.UpdateStatus(ctx, bv)
	return err
}

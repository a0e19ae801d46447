package volume

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
)

var fromBackupPath = specPath.Child("fromBackup")

// defaultBackingImageFromBackup gives a volume restored from a backup the
// backing image the backup was taken over, unless the user named another
// copy of it (the backing-image seed: the name kept in the backup is used
// when none is given). A backup that cannot be read is left to the validator.
func (m *mutator) defaultBackingImageFromBackup(v *v1beta1.Volume) {
	if v.Spec.FromBackup == "" || v.Spec.BackingImage != "" {
		return
	}
	if b, err := m.ds.Backups.GetROOrLive(context.Background(), v.Spec.FromBackup); err == nil {
		v.Spec.BackingImage = b.Status.VolumeBackingImageName
	}
}

// validFromBackup refuses a restore that could not complete or would give
// the wrong data: a backup that is missing, unfinished or going, a volume
// smaller than the backup, or a backing image that is not the one the
// backup was taken over (another copy must have the same checksum).
func (v *validator) validFromBackup(vol *v1beta1.Volume) *admission.FieldError {
	name := vol.Spec.FromBackup
	if vol.Spec.DataSource != "" {
		return admission.Invalid(fromBackupPath, "cannot be set together with spec.dataSource %q; a volume is filled from one source",
			vol.Spec.DataSource)
	}
	b, err := v.ds.Backups.GetROOrLive(context.Background(), name)
	switch {
	case apierrors.IsNotFound(err):
		return admission.Invalid(fromBackupPath, "backup %q not found in namespace %s", name, v.ds.Namespace)
	case err != nil:
		return admission.Invalid(fromBackupPath, "cannot look up backup %q: %v", name, err)
	case b.DeletionTimestamp != nil:
		return admission.Invalid(fromBackupPath, "backup %q is being deleted", name)
	case b.Status.State != v1beta1.BackupStateCompleted:
		return admission.Invalid(fromBackupPath, "backup %q is %s; only a Completed backup can be restored",
			name, stateOrNone(string(b.Status.State)))
	case b.Status.VolumeSize > vol.Spec.Size.Value():
		return admission.Invalid(sizePath, "%d bytes is smaller than backup %q of volume %s (%d bytes)",
			vol.Spec.Size.Value(), name, b.Status.VolumeName, b.Status.VolumeSize)
	}
	return v.backingImageMatchesBackup(vol, b)
}

func (v *validator) backingImageMatchesBackup(vol *v1beta1.Volume, b *v1beta1.Backup) *admission.FieldError {
	want := b.Status.VolumeBackingImageName
	if want == "" || vol.Spec.BackingImage == "" {
		return nil // no image under the backup; one under the volume is hidden by the restore
	}
	bi, err := v.ds.BackingImages.GetROOrLive(context.Background(), vol.Spec.BackingImage)
	switch {
	case apierrors.IsNotFound(err):
		hint := ""
		if b.Status.VolumeBackingImageURL != "" {
			hint = fmt.Sprintf(" (it was downloaded from %s)", b.Status.VolumeBackingImageURL)
		}
		return admission.Invalid(backingImagePath, "backing image %q, which backup %q was taken over, not found; "+
			"create it%s with checksum %s, or name another copy of it", vol.Spec.BackingImage, b.Name, hint,
			orNone(b.Status.VolumeBackingImageChecksum))
	case err != nil:
		return admission.Invalid(backingImagePath, "cannot look up backing image %q: %v", vol.Spec.BackingImage, err)
	}
	sum := bi.Status.Checksum
	if sum == "" {
		sum = bi.Spec.Checksum
	}
	if wantSum := b.Status.VolumeBackingImageChecksum; wantSum != "" && sum != "" && sum != wantSum {
		return admission.Invalid(backingImagePath, "backing image %q (checksum %s) is not the image backup %q was taken over "+
			"(%s, checksum %s); name a copy with the same checksum", vol.Spec.BackingImage, sum, b.Name, want, wantSum)
	}
	return nil
}

func stateOrNone(s string) string {
	if s == "" {
		return "not started"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

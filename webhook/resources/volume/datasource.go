package volume

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

// validDataSource refuses a source the new volume could not be filled
// from: malformed, missing, on its way out, or larger than the volume.
func (v *validator) validDataSource(target *v1beta1.Volume) *admission.FieldError {
	ctx := context.Background() // GetROOrLive bounds its own read
	s := target.Spec.DataSource
	parsed, ok := types.ParseDataSource(s)
	if !ok {
		return admission.Invalid(dataSourcePath, "%q is not a data source: expected %s<volume>/<snapshot> or %s<volume>",
			s, types.SnapshotSourcePrefix, types.VolumeSourcePrefix)
	}
	src := dataSource{volume: parsed.Volume, snapshot: parsed.Snapshot}
	if src.snapshot != "" {
		snap, err := v.ds.Snapshots.GetROOrLive(ctx, src.snapshot)
		switch {
		case apierrors.IsNotFound(err):
			return admission.Invalid(dataSourcePath, "snapshot %q of volume %q does not exist", src.snapshot, src.volume)
		case err != nil:
			return admission.Invalid(dataSourcePath, "cannot look up snapshot %q: %v", src.snapshot, err)
		case snap.Spec.Volume != src.volume:
			return admission.Invalid(dataSourcePath, "snapshot %q belongs to volume %q, not %q",
				src.snapshot, snap.Spec.Volume, src.volume)
		case snap.DeletionTimestamp != nil:
			return admission.Invalid(dataSourcePath, "snapshot %q of volume %q is being deleted", src.snapshot, src.volume)
		}
		return sourceFits(target, snap.Status.RestoreSize, "snapshot "+src.snapshot)
	}
	vol, err := v.ds.Volumes.GetROOrLive(ctx, src.volume)
	switch {
	case apierrors.IsNotFound(err):
		return admission.Invalid(dataSourcePath, "volume %q does not exist", src.volume)
	case err != nil:
		return admission.Invalid(dataSourcePath, "cannot look up volume %q: %v", src.volume, err)
	case vol.DeletionTimestamp != nil:
		return admission.Invalid(dataSourcePath, "volume %q is being deleted", src.volume)
	}
	return sourceFits(target, max(vol.Spec.Size.Value(), vol.Status.CurrentSize), "volume "+src.volume)
}

// dataSource names the parts of a parsed source for the messages.
type dataSource struct {
	volume   string
	snapshot string
}

// sourceFits refuses a volume smaller than its source: a clone copies every
// byte of it. A size not known yet (0) passes; the copy refuses it later.
func sourceFits(target *v1beta1.Volume, sourceSize int64, what string) *admission.FieldError {
	if size := target.Spec.Size.Value(); sourceSize > 0 && size < sourceSize {
		return admission.Invalid(sizePath, "%d bytes is smaller than the data source (%s has %d bytes)", size, what, sourceSize)
	}
	return nil
}

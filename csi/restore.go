package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ParamFromBackup names a Backup a new volume is restored from: the
// StorageClass makes every claim of it a restore of that backup.
const ParamFromBackup = "fromBackup"

// resolveFromBackup checks the backup a StorageClass restores from and
// sizes the volume: a backup that does not exist is NotFound, one not
// completed Unavailable, one larger than the capacity OutOfRange; with no
// capacity requested the volume takes the backup's size. With no backing
// image named the volume goes on the backup's, fetched again from the URL
// the backup recorded when this cluster does not have it.
func (d *Driver) resolveFromBackup(ctx context.Context, r *csi.CapacityRange, want *volumeRequest) error {
	if want.fromBackup == "" {
		return nil
	}
	if want.dataSource != "" {
		return status.Errorf(codes.InvalidArgument, "parameter %s: a volume with a content source cannot also be restored from a backup",
			ParamFromBackup)
	}
	b, err := d.ds.Backups.GetROOrLive(ctx, want.fromBackup)
	if err != nil {
		return apiStatus(err, "parameter "+ParamFromBackup+": backup "+want.fromBackup)
	}
	switch {
	case b.DeletionTimestamp != nil:
		return status.Errorf(codes.NotFound, "parameter %s: backup %s is being deleted", ParamFromBackup, b.Name)
	case b.Status.State != v1beta1.BackupStateCompleted:
		return status.Errorf(codes.Unavailable, "parameter %s: backup %s is %q, not Completed", ParamFromBackup, b.Name, b.Status.State)
	case !want.sizeGiven && b.Status.VolumeSize > want.size:
		want.size = b.Status.VolumeSize
	case b.Status.VolumeSize > want.size:
		return status.Errorf(codes.OutOfRange, "capacity_range: %d bytes is smaller than backup %s (%d bytes)",
			want.size, b.Name, b.Status.VolumeSize)
	}
	if limit := r.GetLimitBytes(); limit > 0 && want.size > limit {
		return status.Errorf(codes.OutOfRange, "capacity_range: backup %s has %d bytes, above limit_bytes %d",
			b.Name, b.Status.VolumeSize, limit)
	}
	if want.image.name == "" && b.Status.VolumeBackingImageName != "" {
		want.image = backingImageParams{name: b.Status.VolumeBackingImageName}
		if _, err := d.ds.BackingImages.GetROOrLive(ctx, want.image.name); apierrors.IsNotFound(err) {
			want.image.url, want.image.checksum = b.Status.VolumeBackingImageURL, b.Status.VolumeBackingImageChecksum
		}
	}
	return nil
}

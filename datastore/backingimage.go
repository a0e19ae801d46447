package datastore

import (
	"fmt"
	"slices"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ImageUsersOnDisk lists, sorted, the live replicas on disk built on the
// backing image: while there are any, the image's copy there is in use.
func (ds *DataStore) ImageUsersOnDisk(image, disk string) ([]string, error) {
	reps, err := ds.Replicas.ListByIndexRO(IndexByBackingImage, image)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range reps {
		if r.Spec.DiskID == disk && r.DeletionTimestamp == nil {
			out = append(out, r.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// BackingImageRef is what a backup keeps of a volume's backing image: the
// image's data is never uploaded, so a restore finds (or re-creates) the
// image by name, URL and checksum.
type BackingImageRef struct {
	Name     string
	URL      string // the download source; "" for an uploaded or exported image
	Checksum string // SHA-512 of the raw data: what any re-created copy must match
}

// BackingImageRefOf is the backing image reference of a volume, for the
// backup code; the zero value when the volume has no backing image. An
// image whose checksum is not known yet (no copy fetched) is an error: a
// backup must not record an image it cannot name exactly.
func (ds *DataStore) BackingImageRefOf(vol *v1beta1.Volume) (BackingImageRef, error) {
	if vol.Spec.BackingImage == "" {
		return BackingImageRef{}, nil
	}
	bi, err := ds.BackingImages.GetRO(vol.Spec.BackingImage)
	if err != nil {
		return BackingImageRef{}, fmt.Errorf("backing image %s of volume %s: %w", vol.Spec.BackingImage, vol.Name, err)
	}
	sum := bi.Status.Checksum
	if sum == "" {
		sum = bi.Spec.Checksum
	}
	if sum == "" {
		return BackingImageRef{}, fmt.Errorf("backing image %s of volume %s: its checksum is not known yet (no copy is ready)", bi.Name, vol.Name)
	}
	ref := BackingImageRef{Name: bi.Name, Checksum: sum}
	if bi.Spec.SourceType == v1beta1.BackingImageSourceTypeDownload {
		ref.URL = bi.Spec.SourceParameters[v1beta1.BackingImageParameterURL]
	}
	return ref, nil
}

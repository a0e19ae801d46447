package volume

import (
	"context"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/webhook/admission"
)

// Data source forms of spec.dataSource (the CRD's pattern checks the
// characters; this reads the parts).
const (
	snapshotSourcePrefix = "snap://" // snap://<volume>/<snapshot>
	volumeSourcePrefix   = "vol://"  // vol://<volume>
)

// dataSource is a parsed spec.dataSource: a volume, or one of its snapshots.
type dataSource struct {
	volume   string
	snapshot string // empty for a whole volume
}

// parseDataSource reads "snap://<volume>/<snapshot>" or "vol://<volume>".
func parseDataSource(s string) (dataSource, bool) {
	if rest, ok := strings.CutPrefix(s, snapshotSourcePrefix); ok {
		volume, snapshot, ok := strings.Cut(rest, "/")
		if !ok || volume == "" || snapshot == "" || strings.Contains(snapshot, "/") {
			return dataSource{}, false
		}
		return dataSource{volume: volume, snapshot: snapshot}, true
	}
	if volume, ok := strings.CutPrefix(s, volumeSourcePrefix); ok && volume != "" && !strings.Contains(volume, "/") {
		return dataSource{volume: volume}, true
	}
	return dataSource{}, false
}

// existingDataSource refuses a source the new volume could not be filled
// from: malformed, missing, or on its way out. This rule stays when cloning
// arrives.
func (v *validator) existingDataSource(s string) *admission.FieldError {
	ctx := context.Background() // GetROOrLive bounds its own read
	src, ok := parseDataSource(s)
	if !ok {
		return admission.Invalid(dataSourcePath, "%q is not a data source: expected %s<volume>/<snapshot> or %s<volume>",
			s, snapshotSourcePrefix, volumeSourcePrefix)
	}
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
		return nil
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
	return nil
}

// cloningNotAvailable refuses every data source while no controller fills a
// volume from one: the volume would be created empty, its source ignored.
// Remove this rule, and only this one, with the clone controller's arrival.
func cloningNotAvailable() *admission.FieldError {
	return admission.Invalid(dataSourcePath, "cloning is not available yet; create the volume without a data source")
}

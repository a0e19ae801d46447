package volume

// The per-volume snapshot limits (issue 14): spec.snapshotMaxCount and
// spec.snapshotMaxSize. The engine enforces them on user snapshots; these
// rules keep them meaningful. Usage is read from the engines' cached
// status.snapshots, the chain the data plane itself counts, never from the
// API server or the data plane: an admission answer must be quick.

import (
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

var (
	snapshotMaxCountPath = specPath.Child("snapshotMaxCount")
	snapshotMaxSizePath  = specPath.Child("snapshotMaxSize")
)

// defaultSnapshotMaxCount fills an unset spec.snapshotMaxCount from the
// snapshot-max-count setting, so that a volume's limit is what it says and
// a later change of the setting does not move the limit of volumes that
// exist (nor refuse their next snapshot unannounced).
func (m *mutator) defaultSnapshotMaxCount(v *v1beta1.Volume) error {
	if v.Spec.SnapshotMaxCount != 0 {
		return nil
	}
	n, err := m.ds.GetSettingInt(types.SettingSnapshotMaxCount)
	if err != nil {
		return admission.Invalid(snapshotMaxCountPath, "not set, and no default can be taken from the %s setting: %v",
			types.SettingSnapshotMaxCount, err)
	}
	v.Spec.SnapshotMaxCount = int32(n)
	return nil
}

// validSnapshotMaxCount keeps a set count within the bounds of the
// snapshot-max-count setting, which it overrides. 0 is accepted: volumes
// stored before the mutator filled it in mean the setting by it.
func validSnapshotMaxCount(vol *v1beta1.Volume) *admission.FieldError {
	n := int64(vol.Spec.SnapshotMaxCount)
	def := types.SettingDefinitions[types.SettingSnapshotMaxCount]
	if n != 0 && (n < def.Min || n > def.Max) {
		return admission.Invalid(snapshotMaxCountPath, "must be between %d and %d, got %d", def.Min, def.Max, n)
	}
	return nil
}

// validSnapshotMaxSize: 0 (no limit), or room for at least two full copies
// of the volume's data, so that a volume whose every block was rewritten
// since its last snapshot can still take one.
func validSnapshotMaxSize(vol *v1beta1.Volume) *admission.FieldError {
	maxSize := vol.Spec.SnapshotMaxSize
	switch {
	case maxSize.Sign() < 0:
		return admission.Invalid(snapshotMaxSizePath, "must not be negative, got %s", maxSize.String())
	case maxSize.Sign() == 0 || vol.Spec.Size.Sign() <= 0: // a bad size is refused on its own
		return nil
	}
	twice := resource.NewQuantity(2*vol.Spec.Size.Value(), vol.Spec.Size.Format)
	if maxSize.Cmp(*twice) < 0 {
		return admission.Invalid(snapshotMaxSizePath, "%s is less than twice spec.size %s; set at least %s, or 0 for no limit",
			maxSize.String(), vol.Spec.Size.String(), twice.String())
	}
	return nil
}

// snapshotLimitChanges judges an update's limits: what changed must be
// valid (a grown spec.size may leave spec.snapshotMaxSize below twice it),
// and a lowered limit must not fall below what the volume already holds:
// the data plane would refuse every user snapshot until some are deleted,
// which the admin should decide knowing the figure.
func (v *validator) snapshotLimitChanges(old, vol *v1beta1.Volume) []*admission.FieldError {
	var errs []*admission.FieldError
	if vol.Spec.SnapshotMaxCount != old.Spec.SnapshotMaxCount {
		errs = append(errs, validSnapshotMaxCount(vol))
	}
	if vol.Spec.Size.Cmp(old.Spec.Size) != 0 || vol.Spec.SnapshotMaxSize.Cmp(old.Spec.SnapshotMaxSize) != 0 {
		errs = append(errs, validSnapshotMaxSize(vol))
	}
	newCount, oldCount := vol.Spec.SnapshotMaxCount, old.Spec.SnapshotMaxCount
	lowerCount := newCount > 0 && (oldCount == 0 || newCount < oldCount)
	newSize, oldSize := vol.Spec.SnapshotMaxSize.Value(), old.Spec.SnapshotMaxSize.Value()
	lowerSize := newSize > 0 && (oldSize == 0 || newSize < oldSize)
	if !lowerCount && !lowerSize {
		return errs
	}
	userCount, size, err := v.snapshotUsage(vol.Name)
	if err != nil {
		return append(errs, admission.Invalid(specPath, "cannot read the volume's snapshot usage to judge a lower limit: %v", err))
	}
	if lowerCount && int(newCount) < userCount {
		errs = append(errs, admission.Invalid(snapshotMaxCountPath,
			"cannot lower to %d: the volume holds %d user snapshots; delete %d of them first",
			newCount, userCount, userCount-int(newCount)))
	}
	if lowerSize && newSize < size {
		errs = append(errs, admission.Invalid(snapshotMaxSizePath,
			"cannot lower to %s: the volume's snapshots hold %s (%d bytes; removed ones count until purged); delete snapshots first",
			vol.Spec.SnapshotMaxSize.String(), types.ApproxBytes(size), size))
	}
	return errs
}

// snapshotUsage is what the volume's chain holds, from the cached status
// of its engines; a migrating volume has two over the same chain, whose
// reports may differ for a moment: the larger counts.
func (v *validator) snapshotUsage(volume string) (userCount int, size int64, err error) {
	engines, err := v.ds.Engines.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range engines {
		n, s := e.Status.SnapshotUsage()
		userCount, size = max(userCount, n), max(size, s)
	}
	return userCount, size, nil
}

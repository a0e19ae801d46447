// Package volume holds the admission rules of Volume: defaults and the
// cleanup finalizer on create (mutator), and what may be written when
// (validator).
package volume

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

// Resource is strata.io/v1beta1 volumes.
var Resource = admission.Resource{
	GroupResource: v1beta1.Resource("volumes"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "Volume",
	NewObject:     func() runtime.Object { return &v1beta1.Volume{} },
}

type mutator struct {
	ds *datastore.DataStore
}

// NewMutator returns the Volume mutator.
func NewMutator(ds *datastore.DataStore) admission.Mutator { return &mutator{ds: ds} }

func (m *mutator) Resource() admission.Resource { return Resource }

// Create adds the cleanup finalizer, so the volume controller tears down
// engines and replicas before the Volume goes, rounds the size up to whole
// blocks, and fills the defaults: the default-replica-count setting for an
// unset replica count, the NBD frontend for an unset frontend, the
// snapshot-max-count setting for an unset snapshotMaxCount, and for a
// restore the backup's backing image when none is named.
func (m *mutator) Create(_ *admission.Request, obj runtime.Object) error {
	v := obj.(*v1beta1.Volume)
	roundSizeUp(v)
	if !slices.Contains(v.Finalizers, types.FinalizerName) {
		v.Finalizers = append(v.Finalizers, types.FinalizerName)
	}
	if v.Spec.NumberOfReplicas == 0 {
		n, err := m.ds.GetSettingInt(types.SettingDefaultReplicaCount)
		if err != nil {
			return admission.Invalid(field.NewPath("spec", "numberOfReplicas"),
				"not set, and no default can be taken from the %s setting: %v", types.SettingDefaultReplicaCount, err)
		}
		v.Spec.NumberOfReplicas = int32(n)
	}
	if v.Spec.Frontend == v1beta1.VolumeFrontendNone {
		v.Spec.Frontend = v1beta1.VolumeFrontendNBD
	}
	m.defaultBackingImageFromBackup(v)
	return m.defaultSnapshotMaxCount(v)
}

// Update rounds a changed size (an expansion) up to whole blocks, and
// fills a snapshotMaxCount cleared by the update from the setting, as on
// create; it changes nothing else: the finalizer is the volume
// controller's to remove. An unchanged size is left as stored, even one
// from before rounding: the data plane rounded it the same way; so is an
// unchanged 0 snapshotMaxCount of a volume stored before it was filled in.
func (m *mutator) Update(_ *admission.Request, oldObj, newObj runtime.Object) error {
	old, v := oldObj.(*v1beta1.Volume), newObj.(*v1beta1.Volume)
	if v.Spec.Size.Cmp(old.Spec.Size) != 0 {
		roundSizeUp(v)
	}
	if v.Spec.SnapshotMaxCount != old.Spec.SnapshotMaxCount {
		return m.defaultSnapshotMaxCount(v)
	}
	return nil
}

// roundSizeUp rounds spec.size up to a multiple of the data plane's 4 KiB
// block, in the notation the writer used: the device serves whole blocks
// (1000 bytes become 4096), and spec.size must say what it holds. A size
// that is not positive is left for the validator to refuse.
func roundSizeUp(v *v1beta1.Volume) {
	n := v.Spec.Size.Value() // a fraction of a byte counts as a byte
	if n <= 0 {
		return
	}
	if rounded, ok := types.RoundUpToBlock(n); ok && rounded != n {
		v.Spec.Size = *resource.NewQuantity(rounded, v.Spec.Size.Format)
	}
}

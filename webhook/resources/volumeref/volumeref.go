// Package volumeref labels and owns objects that belong to a volume
// (VolumeAttachments, Snapshots) the same way in every mutator.
package volumeref

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Label sets the strata.io/volume label to the volume's name. A name longer
// than a label value allows goes unlabelled rather than making the object
// impossible to write; the datastore indexes these kinds by spec.volume.
func Label(obj metav1.Object, volume string) {
	labels := obj.GetLabels()
	if labels[types.LabelVolume] == volume || len(validation.IsValidLabelValue(volume)) != 0 {
		return
	}
	if labels == nil {
		labels = map[string]string{}
	}
	labels[types.LabelVolume] = volume
	obj.SetLabels(labels)
}

// Own makes the volume, by UID, an owner of obj (neither controller nor
// blocking its deletion). A reference to an earlier volume of the same name
// is replaced: the garbage collector would delete obj with it.
func Own(obj metav1.Object, vol *v1beta1.Volume) {
	refs := slices.DeleteFunc(obj.GetOwnerReferences(), func(ref metav1.OwnerReference) bool {
		return isVolumeRef(ref) && ref.Name == vol.Name && ref.UID != vol.UID
	})
	for _, ref := range refs {
		if ref.UID == vol.UID {
			obj.SetOwnerReferences(refs)
			return
		}
	}
	obj.SetOwnerReferences(append(refs, metav1.OwnerReference{
		APIVersion: v1beta1.SchemeGroupVersion.String(),
		Kind:       "Volume",
		Name:       vol.Name,
		UID:        vol.UID,
	}))
}

func isVolumeRef(ref metav1.OwnerReference) bool {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == v1beta1.SchemeGroupVersion.Group && ref.Kind == "Volume"
}

// Package snapshot holds the admission rules of Snapshot (seed snapshot-crd):
// the volume label, the cleanup finalizer and the owner reference to the
// Volume on create (mutator), and a usable name, an existing volume, valid
// engine labels and an immutable spec and volume label (validator).
package snapshot

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
)

// Resource is strata.io/v1beta1 snapshots.
var Resource = admission.Resource{
	GroupResource: v1beta1.Resource("snapshots"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "Snapshot",
	NewObject:     func() runtime.Object { return &v1beta1.Snapshot{} },
}

type mutator struct {
	ds *datastore.DataStore
}

// NewMutator returns the Snapshot mutator.
func NewMutator(ds *datastore.DataStore) admission.Mutator { return &mutator{ds: ds} }

func (m *mutator) Resource() admission.Resource { return Resource }

// Create labels the snapshot with its volume, adds the cleanup finalizer (the
// snapshot controller removes the snapshot from the engine before the CR
// goes) and makes the Volume, by UID, an owner. The owner reference is
// neither the controller nor blocks the owner's deletion: the volume
// controller waits for a deleted volume's snapshots itself, and the garbage
// collector must not race it.
func (m *mutator) Create(_ *admission.Request, obj runtime.Object) error {
	snap := obj.(*v1beta1.Snapshot)
	name := snap.Spec.Volume
	if name == "" {
		return nil // the validator denies it
	}
	// A volume name longer than a label value allows goes unlabelled rather
	// than making the snapshot impossible to create; the datastore indexes
	// snapshots by spec.volume anyway.
	if snap.Labels[types.LabelVolume] != name && len(validation.IsValidLabelValue(name)) == 0 {
		if snap.Labels == nil {
			snap.Labels = map[string]string{}
		}
		snap.Labels[types.LabelVolume] = name
	}
	if !slices.Contains(snap.Finalizers, types.FinalizerName) {
		snap.Finalizers = append(snap.Finalizers, types.FinalizerName)
	}
	vol, err := m.ds.Volumes.GetRO(name)
	if err != nil {
		return nil // no such volume: the validator denies it
	}
	// A reference to an earlier volume of the same name would have the
	// garbage collector delete the new snapshot: it is replaced.
	snap.OwnerReferences = slices.DeleteFunc(snap.OwnerReferences, func(ref metav1.OwnerReference) bool {
		return isVolumeRef(ref) && ref.Name == vol.Name && ref.UID != vol.UID
	})
	for _, ref := range snap.OwnerReferences {
		if ref.UID == vol.UID {
			return nil
		}
	}
	snap.OwnerReferences = append(snap.OwnerReferences, metav1.OwnerReference{
		APIVersion: v1beta1.SchemeGroupVersion.String(),
		Kind:       "Volume",
		Name:       vol.Name,
		UID:        vol.UID,
	})
	return nil
}

// Update changes nothing: spec and volume label are immutable, and the
// finalizer is the snapshot controller's to remove.
func (m *mutator) Update(*admission.Request, runtime.Object, runtime.Object) error { return nil }

func isVolumeRef(ref metav1.OwnerReference) bool {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == v1beta1.SchemeGroupVersion.Group && ref.Kind == "Volume"
}

// Package snapshot holds the admission rules of Snapshot (seed snapshot-crd):
// the volume label, the cleanup finalizer and the owner reference to the
// Volume on create (mutator), and a usable name, an existing volume, valid
// engine labels and an immutable spec and volume label (validator).
package snapshot

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/resources/volumeref"
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
	volumeref.Label(snap, name)
	if !slices.Contains(snap.Finalizers, types.FinalizerName) {
		snap.Finalizers = append(snap.Finalizers, types.FinalizerName)
	}
	if vol, err := m.ds.Volumes.GetROOrLive(context.Background(), name); err == nil {
		volumeref.Own(snap, vol)
	} // no such volume: the validator denies it
	return nil
}

// Update changes nothing: spec and volume label are immutable, and the
// finalizer is the snapshot controller's to remove.
func (m *mutator) Update(*admission.Request, runtime.Object, runtime.Object) error { return nil }

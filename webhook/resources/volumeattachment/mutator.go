// Package volumeattachment holds the admission rules of VolumeAttachment
// (seed volume-attachment): the volume label, the owner reference to the
// Volume and the ticket generations (mutator), and the shape of the tickets
// (validator).
package volumeattachment

import (
	"context"
	"maps"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/webhook/admission"
	"github.com/strata-storage/strata/webhook/resources/volumeref"
)

// Resource is strata.io/v1beta1 volumeattachments.
var Resource = admission.Resource{
	GroupResource: v1beta1.Resource("volumeattachments"),
	Version:       v1beta1.SchemeGroupVersion.Version,
	Kind:          "VolumeAttachment",
	NewObject:     func() runtime.Object { return &v1beta1.VolumeAttachment{} },
}

type mutator struct {
	ds *datastore.DataStore
}

// NewMutator returns the VolumeAttachment mutator.
func NewMutator(ds *datastore.DataStore) admission.Mutator { return &mutator{ds: ds} }

func (m *mutator) Resource() admission.Resource { return Resource }

// Create labels the attachment with its volume, makes the Volume its owner
// (so deleting the volume collects it) and starts every ticket at
// generation 1. The seed asks for no cleanup, hence no finalizer.
func (m *mutator) Create(_ *admission.Request, obj runtime.Object) error {
	va := obj.(*v1beta1.VolumeAttachment)
	m.labelAndOwn(va)
	for _, t := range va.Spec.AttachmentTickets {
		if t != nil {
			t.Generation = 1
		}
	}
	return nil
}

// Update keeps the generation of an unchanged ticket, bumps that of a
// changed one and starts a new one at 1: the generation is the system's,
// whatever the writer put there. An attachment created before its volume
// gets its label and owner on a later update.
func (m *mutator) Update(_ *admission.Request, oldObj, newObj runtime.Object) error {
	old, va := oldObj.(*v1beta1.VolumeAttachment), newObj.(*v1beta1.VolumeAttachment)
	if va.DeletionTimestamp == nil {
		m.labelAndOwn(va)
	}
	for id, t := range va.Spec.AttachmentTickets {
		if t == nil {
			continue
		}
		prev := old.Spec.AttachmentTickets[id]
		switch {
		case prev == nil:
			t.Generation = 1
		case ticketChanged(prev, t):
			t.Generation = prev.Generation + 1
		default:
			t.Generation = prev.Generation
		}
	}
	return nil
}

// ticketChanged compares what a ticket asks for; an empty and a missing
// parameter map ask for the same.
func ticketChanged(a, b *v1beta1.AttachmentTicket) bool {
	return a.ID != b.ID || a.Type != b.Type || a.NodeID != b.NodeID || !maps.Equal(a.Parameters, b.Parameters)
}

func (m *mutator) labelAndOwn(va *v1beta1.VolumeAttachment) {
	name := va.Spec.Volume
	if name == "" {
		return // the validator denies it
	}
	volumeref.Label(va, name)
	if vol, err := m.ds.Volumes.GetROOrLive(context.Background(), name); err == nil {
		volumeref.Own(va, vol)
	} // no volume yet: it becomes the owner on a later update
}

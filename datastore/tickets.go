package datastore

import (
	"context"
	"maps"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// EnsureTicket puts a ticket into a volume's VolumeAttachment, the way
// anything that needs a volume attached for a while asks for it (snapshot,
// backup, clone, the CSI attacher). The VolumeAttachment controller does the
// attaching; the ticket's owner reference lets the reaper remove it if its
// owner vanishes. A ticket already there as given costs no write. A missing
// VolumeAttachment (created with the volume) is returned as NotFound.
func (ds *DataStore) EnsureTicket(ctx context.Context, volume string, t *v1beta1.AttachmentTicket) error {
	vaRO, err := ds.VolumeAttachments.GetRO(volume)
	if err != nil {
		return err
	}
	if old, ok := vaRO.Spec.AttachmentTickets[t.ID]; ok && old.Type == t.Type && old.NodeID == t.NodeID &&
		maps.Equal(old.Parameters, t.Parameters) && equality.Semantic.DeepEqual(old.OwnerRef, t.OwnerRef) {
		return nil
	}
	va := vaRO.DeepCopy()
	if va.Spec.AttachmentTickets == nil {
		va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
	}
	va.Spec.AttachmentTickets[t.ID] = t
	_, err = ds.VolumeAttachments.Update(ctx, va)
	return err
}

// RemoveTicket takes a ticket out of a volume's VolumeAttachment; a ticket
// or VolumeAttachment already gone is fine.
func (ds *DataStore) RemoveTicket(ctx context.Context, volume, id string) error {
	vaRO, err := ds.VolumeAttachments.GetRO(volume)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, ok := vaRO.Spec.AttachmentTickets[id]; !ok {
		return nil
	}
	va := vaRO.DeepCopy()
	delete(va.Spec.AttachmentTickets, id)
	_, err = ds.VolumeAttachments.Update(ctx, va)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

package kit

import (
	"context"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EnsureTicket puts a ticket into a volume's VolumeAttachment
// (DataStore.EnsureTicket). A missing VolumeAttachment is not an error here:
// it is created with the volume and its creation enqueues nobody, so the
// caller retries.
func (c *BaseController) EnsureTicket(ctx context.Context, volume string, t *v1beta1.AttachmentTicket) error {
	return c.DS.EnsureTicket(ctx, volume, t)
}

// RemoveTicket takes a ticket out of a volume's VolumeAttachment; a ticket
// or VolumeAttachment already gone is fine.
func (c *BaseController) RemoveTicket(ctx context.Context, volume, id string) error {
	return c.DS.RemoveTicket(ctx, volume, id)
}

// EnsureSnapshotterTicket asks for vol to be attached, without a frontend,
// for a snapshot operation owned by owner (a Snapshot, a SnapshotGroup):
// where it is attached, else on this node.
func (c *BaseController) EnsureSnapshotterTicket(ctx context.Context, vol *v1beta1.Volume, id, kind string, owner metav1.Object) error {
	node := vol.Spec.NodeID
	if node == "" {
		node = c.ControllerID
	}
	return c.EnsureTicket(ctx, vol.Name, &v1beta1.AttachmentTicket{
		ID: id, Type: v1beta1.AttacherTypeSnapshotController, NodeID: node,
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.AnyValue},
		OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: kind,
			Namespace: owner.GetNamespace(), Name: owner.GetName(), UID: string(owner.GetUID())},
	})
}

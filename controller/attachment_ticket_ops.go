package controller

import (
	"context"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ensureTicket puts a ticket into a volume's VolumeAttachment
// (DataStore.EnsureTicket). A missing VolumeAttachment is not an error here:
// it is created with the volume and its creation enqueues nobody, so the
// caller retries.
func (c *baseController) ensureTicket(ctx context.Context, volume string, t *v1beta1.AttachmentTicket) error {
	return c.ds.EnsureTicket(ctx, volume, t)
}

// removeTicket takes a ticket out of a volume's VolumeAttachment; a ticket
// or VolumeAttachment already gone is fine.
func (c *baseController) removeTicket(ctx context.Context, volume, id string) error {
	return c.ds.RemoveTicket(ctx, volume, id)
}

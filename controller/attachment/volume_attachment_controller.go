package attachment

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// syncVolumeAttachment reconciles one volume's attachment:
//  1. a volume without a VolumeAttachment gets one (with an upgrade ticket
//     keeping an attached volume attached);
//  2. tickets whose owner is gone are removed (the reaper);
//  3. the volume's attachment fields follow the tickets (decideAttachment);
//  4. every ticket's status is reported.
//
// Every write is made on a fresh copy of the cache; a conflict is returned
// and the key retried.
func (c *VolumeAttachmentController) syncVolumeAttachment(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	vol, err := c.DS.Volumes.GetRO(name)
	if apierrors.IsNotFound(err) {
		// The garbage collector removes the VolumeAttachment of a deleted volume.
		return nil
	}
	if err != nil {
		return err
	}
	va, err := c.DS.VolumeAttachments.GetRO(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// The manager that reconciles the volume reconciles its attachment.
	if responsible, err := c.IsResponsibleFor(key, "", vol.Status.OwnerID); err != nil || !responsible {
		return err
	}
	if va == nil {
		return c.createVolumeAttachment(ctx, vol)
	}
	if va.DeletionTimestamp != nil {
		// Nothing to clean up: the VolumeAttachment has no finalizer of ours.
		return nil
	}
	if va.Spec.Volume != vol.Name {
		c.Logger.WithFields(map[string]interface{}{"volumeAttachment": va.Name, "volume": va.Spec.Volume}).
			Warn("VolumeAttachment names another volume than its own name; ignoring it")
		return nil
	}

	va, unwatched, err := c.reapTickets(ctx, va)
	if err != nil {
		return fmt.Errorf("volume attachment %s: removing tickets of owners that are gone: %w", name, err)
	}
	if vol, err = c.applyAttachmentDecision(ctx, vol, va); err != nil {
		return fmt.Errorf("volume attachment %s: applying the tickets to the volume: %w", name, err)
	}
	if err := c.updateTicketStatuses(ctx, vol, va, unwatched); err != nil {
		return fmt.Errorf("volume attachment %s: writing ticket statuses: %w", name, err)
	}
	return nil
}

// applyAttachmentDecision writes the volume's attachment fields when the
// tickets ask for a change, and tells each step as an event on the
// VolumeAttachment. It returns the volume as it now is.
func (c *VolumeAttachmentController) applyAttachmentDecision(ctx context.Context, vol *v1beta1.Volume,
	va *v1beta1.VolumeAttachment) (*v1beta1.Volume, error) {
	want, actions := decideAttachment(vol, va.Spec.AttachmentTickets)
	if want == adSpecOf(vol) {
		return vol, nil
	}
	cp := vol.DeepCopy()
	want.applyTo(cp)
	updated, err := c.DS.Volumes.Update(ctx, cp)
	if err != nil {
		return vol, err
	}
	for _, a := range actions {
		c.Logger.WithField("volume", vol.Name).Info(a.Message)
		c.Recorder.Event(va, corev1.EventTypeNormal, a.Reason, a.Message)
	}
	return updated, nil
}

// updateTicketStatuses writes va.status when it changed: one status per
// ticket, none for tickets that are gone, and the summary kubectl get va
// shows.
func (c *VolumeAttachmentController) updateTicketStatuses(ctx context.Context, vol *v1beta1.Volume,
	va *v1beta1.VolumeAttachment, unwatched map[string]string) error {
	now := metav1.NewTime(c.DS.Clock.Now())
	statuses := ticketStatuses(vol, va, now)
	markUnwatchedOwners(statuses, unwatched, now)
	want := attachmentSummary(vol, statuses)
	want.AttachmentTicketStatuses = statuses
	if len(statuses) == 0 && len(va.Status.AttachmentTicketStatuses) == 0 {
		want.AttachmentTicketStatuses = va.Status.AttachmentTicketStatuses // nil and empty say the same
	}
	if equality.Semantic.DeepEqual(want, va.Status) {
		return nil
	}
	cp := va.DeepCopy()
	cp.Status = want
	_, err := c.DS.VolumeAttachments.UpdateStatus(ctx, cp)
	return err
}

// createVolumeAttachment creates the volume's VolumeAttachment, owned by the
// volume so the garbage collector removes it with the volume. A volume
// attached without one (created before VolumeAttachments existed, or whose
// VolumeAttachment was deleted) gets a ticket that keeps it attached.
func (c *VolumeAttachmentController) createVolumeAttachment(ctx context.Context, vol *v1beta1.Volume) error {
	if vol.DeletionTimestamp != nil || vol.Status.State == v1beta1.VolumeStateDeleting {
		return nil
	}
	va := &v1beta1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name: vol.Name, Namespace: vol.Namespace,
			Labels: map[string]string{types.LabelVolume: vol.Name},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(vol, v1beta1.SchemeGroupVersion.WithKind("Volume")),
			},
		},
		Spec: v1beta1.VolumeAttachmentSpec{Volume: vol.Name, AttachmentTickets: map[string]*v1beta1.AttachmentTicket{}},
	}
	upgrade := upgradeTicket(vol)
	if upgrade != nil {
		va.Spec.AttachmentTickets[upgrade.ID] = upgrade
	}
	created, err := c.DS.VolumeAttachments.Create(ctx, va)
	if apierrors.IsAlreadyExists(err) {
		// The cache lags; the informer brings it and enqueues the key.
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating the VolumeAttachment of volume %s: %w", vol.Name, err)
	}
	if upgrade != nil {
		msg := fmt.Sprintf("volume %s is attached (or attaching) to node %s without a VolumeAttachment: "+
			"added ticket %s (%s) to keep it there", vol.Name, upgrade.NodeID, upgrade.ID, upgrade.Type)
		c.Logger.WithField("volume", vol.Name).Info(msg)
		c.Recorder.Event(created, corev1.EventTypeNormal, EventReasonADUpgradeTicket, msg)
	}
	return nil
}

// upgradeTicketPrefix starts the ID of a ticket made for a volume that was
// attached before it had a VolumeAttachment.
const upgradeTicketPrefix = "upgrade-"

// upgradeTicket is the ticket that keeps a volume attached where it is (or
// is being attached) when its VolumeAttachment is created: of the workload
// type that last attached it (csi-attacher or strata-api), else strata-api,
// with the frontend as it is now. nil for a detached volume.
//
// Only workload types are kept: a snapshot or backup controller would never
// remove a ticket it did not make, and its low priority would let it linger,
// while a strata-api ticket is one the user removes by detaching.
func upgradeTicket(vol *v1beta1.Volume) *v1beta1.AttachmentTicket {
	node := vol.Status.CurrentNodeID
	if node == "" {
		node = vol.Spec.NodeID
	}
	if node == "" {
		return nil
	}
	typ := v1beta1.AttacherTypeStrataAPI
	if t := v1beta1.AttacherType(vol.Spec.LastAttachedBy); isWorkload(t) {
		typ = t
	}
	return &v1beta1.AttachmentTicket{
		ID: upgradeTicketPrefix + node, Type: typ, NodeID: node,
		Parameters: map[string]string{
			v1beta1.AttachmentParameterDisableFrontend: strconv.FormatBool(vol.Spec.DisableFrontend),
		},
	}
}

package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// attach and detach: a strata-api ticket on the volume's VolumeAttachment,
// owned by a Lease the API keeps for the client. The client renews it by
// asking again with its ticketID before ttlSeconds pass; a client that
// vanishes stops renewing, the Lease lapses and the ticket reaper removes
// the ticket (Longhorn's open #13633 is a ticket a vanished client left).

const (
	defaultTicketTTL = 300 * time.Second
	minTicketTTL     = 10 * time.Second
	maxTicketTTL     = 24 * time.Hour
)

// ticketIDPattern: the IDs the API gives out, and takes back.
var ticketIDPattern = regexp.MustCompile(`^api-[a-z0-9]{1,32}$`)

// attachRequest is the body of attach (a renewal names its ticketID).
type attachRequest struct {
	Node            string `json:"node"`
	DisableFrontend bool   `json:"disableFrontend"`
	TicketID        string `json:"ticketID"`
	TTLSeconds      int64  `json:"ttlSeconds"`
}

// attachReply tells the client its ticket and when to renew it by.
type attachReply struct {
	TicketID         string                    `json:"ticketID"`
	LeaseExpiresAt   time.Time                 `json:"leaseExpiresAt"`
	VolumeAttachment *v1beta1.VolumeAttachment `json:"volumeAttachment"`
}

func (req *attachRequest) check(c *call) (time.Duration, error) {
	if req.Node == "" {
		return 0, badInput("node", "missing: name the node to attach to")
	}
	if _, err := c.opts.Cache.Nodes.GetRO(req.Node); err != nil {
		return 0, badInput("node", "%q is not a Strata node", req.Node)
	}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	switch {
	case req.TTLSeconds == 0:
		ttl = defaultTicketTTL
	case ttl < minTicketTTL || ttl > maxTicketTTL:
		return 0, badInput("ttlSeconds", "%d is outside %d–%d", req.TTLSeconds, int(minTicketTTL.Seconds()), int(maxTicketTTL.Seconds()))
	}
	if req.TicketID == "" {
		req.TicketID = newTicketID()
	} else if !ticketIDPattern.MatchString(req.TicketID) {
		return 0, badInput("ticketID", "%q is not a ticket ID this API gave out (%s)", req.TicketID, ticketIDPattern)
	}
	return ttl, nil
}

func newTicketID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "api-" + hex.EncodeToString(b)
}

func ticketLeaseName(ticketID string) string { return "strata-" + ticketID }

func (c *call) attachVolume() error {
	volume := c.r.PathValue("name")
	var req attachRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	ttl, err := req.check(c)
	if err != nil {
		return err
	}
	if err := c.authorize("update", "volumeattachments", c.opts.Namespace, volume); err != nil {
		return err
	}
	if _, err := volumes.cached(c, volume); err != nil {
		return err
	}
	va, lease, added, err := c.holdTicket(volume, req, ttl, false)
	if err != nil {
		return err
	}
	if added { // not each renewal
		c.event(volume, EventReasonAttachRequested, "ticket %s for node %s added", req.TicketID, req.Node)
	}
	return c.reply(http.StatusOK, attachReply{TicketID: req.TicketID, VolumeAttachment: va,
		LeaseExpiresAt: lease.Spec.RenewTime.Add(ttl).UTC()})
}

// holdTicket creates or renews the ticket req names and its Lease; added
// says it is new.
func (c *call) holdTicket(volume string, req attachRequest, ttl time.Duration, reverting bool) (
	va *v1beta1.VolumeAttachment, lease *coordinationv1.Lease, added bool, err error) {
	lease, err = c.renewTicketLease(req.TicketID, volume, ttl, reverting)
	if err != nil {
		return nil, nil, false, fmt.Errorf("keeping the ticket's lease: %w", err)
	}
	ticket := &v1beta1.AttachmentTicket{ID: req.TicketID, Type: v1beta1.AttacherTypeStrataAPI, NodeID: req.Node,
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: fmt.Sprint(req.DisableFrontend)},
		OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease",
			Namespace: lease.Namespace, Name: lease.Name, UID: string(lease.UID)}}
	va, err = c.editTickets(c.ctx(), volume, func(tickets map[string]*v1beta1.AttachmentTicket) error {
		old := tickets[ticket.ID]
		added = old == nil
		if old != nil {
			ticket.Generation = old.Generation
			if equality.Semantic.DeepEqual(old, ticket) {
				return nil
			}
		}
		tickets[ticket.ID] = ticket
		return nil
	})
	return va, lease, added, err
}

// detachRequest names the ticket to remove.
type detachRequest struct {
	TicketID string `json:"ticketID"`
}

func (c *call) detachVolume() error {
	volume := c.r.PathValue("name")
	var req detachRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if !ticketIDPattern.MatchString(req.TicketID) {
		return badInput("ticketID", "%q is not a ticket ID this API gave out (%s)", req.TicketID, ticketIDPattern)
	}
	if err := c.authorize("update", "volumeattachments", c.opts.Namespace, volume); err != nil {
		return err
	}
	if err := c.removeTicket(c.ctx(), volume, req.TicketID); err != nil {
		return err
	}
	c.event(volume, EventReasonDetachRequested, "ticket %s removed", req.TicketID)
	return c.reply(http.StatusNoContent, nil)
}

// removeTicket removes an API ticket of the volume, then its Lease.
func (c *call) removeTicket(ctx context.Context, volume, ticketID string) error {
	if _, err := c.editTickets(ctx, volume, func(tickets map[string]*v1beta1.AttachmentTicket) error {
		t := tickets[ticketID]
		if t == nil || t.Type != v1beta1.AttacherTypeStrataAPI {
			return fmt.Errorf("ticket %q of volume %q: %w", ticketID, volume, errNotFound)
		}
		delete(tickets, ticketID)
		return nil
	}); err != nil {
		return err
	}
	err := c.opts.Cache.APITicketLeases.Delete(ctx, ticketLeaseName(ticketID))
	if err != nil && !apierrors.IsNotFound(err) {
		// The ticket is gone; a Lease left behind owns nothing.
		c.opts.Log.WithError(err).WithField("ticket", ticketID).Warn("Cannot delete a detached ticket's Lease")
	}
	return nil
}

// dropTicket is removeTicket for a ticket the API itself took: a failure
// is logged (the Lease lapses, and the reaper removes the ticket then).
func (c *call) dropTicket(ctx context.Context, volume, ticketID string) {
	if err := c.removeTicket(ctx, volume, ticketID); err != nil {
		c.opts.Log.WithError(err).WithField("volume", volume).WithField("ticket", ticketID).
			Warn("Cannot remove the API's own ticket; its lease will lapse")
	}
}

// editTickets changes the volume's tickets as the caller, writing only
// when edit changed them.
func (c *call) editTickets(ctx context.Context, volume string, edit func(map[string]*v1beta1.AttachmentTicket) error) (*v1beta1.VolumeAttachment, error) {
	strata, err := c.strata()
	if err != nil {
		return nil, err
	}
	vas := strata.StrataV1beta1().VolumeAttachments(c.opts.Namespace)
	var out *v1beta1.VolumeAttachment
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		va, err := vas.Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return err
		}
		before := va.DeepCopy()
		if va.Spec.AttachmentTickets == nil {
			va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
		}
		if err := edit(va.Spec.AttachmentTickets); err != nil {
			return err
		}
		if equality.Semantic.DeepEqual(before.Spec, va.Spec) {
			out = va
			return nil
		}
		c.stamp(va)
		if out, err = vas.Update(ctx, va, metav1.UpdateOptions{}); err == nil {
			c.wrote(out, volume, "attachment tickets updated")
		}
		return err
	})
	return out, err
}

// renewTicketLease creates the ticket's Lease or renews it, as the manager
// (it is the API's bookkeeping, not the caller's object).
func (c *call) renewTicketLease(ticketID, volume string, ttl time.Duration, reverting bool) (*coordinationv1.Lease, error) {
	leases := c.opts.Cache.APITicketLeases
	now := metav1.NewMicroTime(time.Now())
	seconds := int32(ttl.Seconds())
	holder := c.user.GetName()
	l, err := leases.GetLive(c.ctx(), ticketLeaseName(ticketID))
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: ticketLeaseName(ticketID), Namespace: c.opts.Namespace,
			Labels: map[string]string{types.LabelComponent: types.ComponentAPITicket, types.LabelVolume: volume}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds, AcquireTime: &now, RenewTime: &now}}
		if reverting {
			l.Labels[types.LabelRevertingNode] = c.opts.NodeName
		}
		return leases.Create(c.ctx(), l)
	}
	if err != nil {
		return nil, err
	}
	if l.Labels[types.LabelVolume] != volume {
		return nil, badInput("ticketID", "%q is a ticket of volume %q", ticketID, l.Labels[types.LabelVolume])
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds, l.Spec.HolderIdentity = &now, &seconds, &holder
	return leases.Update(c.ctx(), l)
}

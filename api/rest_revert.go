package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// revert: the volume, detached and held by no ticket, is attached without
// a frontend to this manager's node through an API ticket, reverted to the
// snapshot in its engine, and given back. Later snapshots stay.

// revertAttachTimeout bounds the wait for the volume to come up for the
// revert; revertTicketTTL outlasts it, so the ticket lapses by itself if
// this manager dies midway.
const (
	revertAttachTimeout = 2 * time.Minute
	revertTicketTTL     = 5 * time.Minute
)

// Events on a Volume of what users did through the API that no controller
// reports: a revert, an attachment ticket added (not each renewal) or
// removed. Each names the user.
const (
	EventReasonReverted        = "Reverted"
	EventReasonAttachRequested = "AttachRequested"
	EventReasonDetachRequested = "DetachRequested"
)

// errInUse is a 409: the volume is attached, or asked for.
var errInUse = errors.New("in use")

type revertRequest struct {
	Snapshot string `json:"snapshot"`
}

func (c *call) revertVolume() error {
	volume := c.r.PathValue("name")
	var req revertRequest
	if err := c.decode(&req); err != nil {
		return err
	}
	if req.Snapshot == "" {
		return badInput("snapshot", "missing: name the snapshot to revert to")
	}
	if err := c.authorize("update", "volumes", c.opts.Namespace, volume); err != nil {
		return err
	}
	if err := c.revertable(volume, req.Snapshot); err != nil {
		return err
	}
	if c.opts.DataPlane == nil || c.opts.NodeName == "" {
		return fmt.Errorf("%w: this manager has no data plane to revert with", ErrAuthUnavailable)
	}
	ticket := newTicketID()
	attach := attachRequest{Node: c.opts.NodeName, DisableFrontend: true, TicketID: ticket}
	if _, _, _, err := c.holdTicket(volume, attach, revertTicketTTL, true); err != nil {
		return err
	}
	// Given back whatever happens; a context of its own, so a client that
	// hangs up does not leave the ticket until its lease lapses.
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c.dropTicket(ctx, volume, ticket)
	}()
	engine, err := c.waitEngineUp(volume)
	if err != nil {
		return err
	}
	dp, err := c.engineDataPlane(engine)
	if err != nil {
		return err
	}
	if err := dp.SnapshotRevert(c.ctx(), engine.Name, req.Snapshot); err != nil {
		switch {
		case errors.Is(err, engineapi.ErrNotFound):
			return fmt.Errorf("snapshot %q of volume %q: %w", req.Snapshot, volume, errNotFound)
		case errors.Is(err, engineapi.ErrBusy):
			return fmt.Errorf("volume %q: %w: %v", volume, errInUse, err)
		}
		return fmt.Errorf("reverting volume %q to %q: %w", volume, req.Snapshot, err)
	}
	c.opts.Log.WithField("volume", volume).WithField("snapshot", req.Snapshot).WithField("user", c.user.GetName()).
		Info("Volume reverted through the REST API")
	v, err := volumes.cached(c, volume)
	if err != nil {
		return err
	}
	c.event(volume, EventReasonReverted, "reverted to snapshot %s", req.Snapshot)
	return c.reply(http.StatusOK, v)
}

// revertable: the snapshot is the volume's, and nothing holds the volume.
func (c *call) revertable(volume, snapshot string) error {
	v, err := volumes.cached(c, volume)
	if err != nil {
		return err
	}
	if s, err := c.opts.Cache.Snapshots.GetRO(snapshot); err != nil || s.Spec.Volume != volume {
		return fmt.Errorf("snapshot %q of volume %q: %w", snapshot, volume, errNotFound)
	}
	va, err := c.opts.Cache.VolumeAttachments.GetRO(volume)
	if err == nil && len(va.Spec.AttachmentTickets) > 0 {
		var held []string
		for _, t := range va.Spec.AttachmentTickets {
			held = append(held, fmt.Sprintf("%s (%s on %s)", t.ID, t.Type, t.NodeID))
		}
		slices.Sort(held)
		return fmt.Errorf("volume %q is %w: a revert needs it detached and unclaimed, and tickets hold it: %s",
			volume, errInUse, strings.Join(held, ", "))
	}
	if v.Status.State != v1beta1.VolumeStateDetached {
		return fmt.Errorf("volume %q is %w: it is %s, a revert needs it detached", volume, errInUse, v.Status.State)
	}
	return nil
}

// waitEngineUp waits until the volume is attached here with its engine
// running, and returns the engine.
func (c *call) waitEngineUp(volume string) (*v1beta1.Engine, error) {
	var engine *v1beta1.Engine
	ctx, cancel := context.WithTimeout(c.ctx(), revertAttachTimeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(context.Context) (bool, error) {
		v, err := c.opts.Cache.Volumes.GetRO(volume)
		if err != nil || v.Status.State != v1beta1.VolumeStateAttached || v.Status.CurrentNodeID != c.opts.NodeName {
			return false, nil
		}
		engines, err := c.opts.Cache.Engines.ListByIndexRO(datastore.IndexByVolume, volume)
		if err != nil {
			return false, err
		}
		for _, e := range engines {
			if e.Spec.NodeID == c.opts.NodeName && e.Status.CurrentState == v1beta1.InstanceStateRunning {
				engine = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("volume %q did not come up on %s within %s: %w", volume, c.opts.NodeName,
			revertAttachTimeout, err)
	}
	return engine, nil
}

func (c *call) engineDataPlane(e *v1beta1.Engine) (engineapi.DataPlane, error) {
	im, err := c.opts.Cache.InstanceManagers.GetRO("im-" + e.Spec.NodeID)
	if err != nil || im.Status.Endpoint == "" {
		return nil, fmt.Errorf("the instance manager of node %s has no endpoint", e.Spec.NodeID)
	}
	return c.opts.DataPlane.DataPlane(im.Status.Endpoint)
}

// ReleaseRevertTickets deletes the ticket Leases of reverts that node's
// manager was running when it stopped (killed mid-revert): a manager that
// starts runs none, and the volume they hold would otherwise stay attached,
// refusing the user's retry, until the Lease lapsed. The attachment
// reaper then removes their tickets. Call it once the caches are synced.
func ReleaseRevertTickets(ctx context.Context, cache *datastore.DataStore, node string, log logrus.FieldLogger) error {
	leases, err := cache.APITicketLeases.ListRO(labels.SelectorFromSet(labels.Set{types.LabelRevertingNode: node}))
	if err != nil {
		return err
	}
	for _, l := range leases {
		if _, err := cache.APITicketLeases.DeleteIfUID(ctx, l.Name, l.UID); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing the revert ticket Lease %s: %w", l.Name, err)
		}
		log.WithFields(logrus.Fields{"lease": l.Name, "volume": l.Labels[types.LabelVolume]}).
			Warn("Released the ticket of a revert this manager was running when it stopped")
	}
	return nil
}

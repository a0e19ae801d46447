package snapshot

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of the snapshot controller.
const (
	EventReasonSnapshotCreated = "SnapshotCreated"
	EventReasonSnapshotRemoved = "SnapshotRemoved"
	EventReasonSnapshotWaiting = "WaitingForReaders"
	EventReasonSnapshotLost    = "SnapshotLost"
	EventReasonSnapshotFailed  = "SnapshotFailed"

	snapshotLostMessage = "the snapshot is no longer in the volume's chain"
)

// snapshotTicketID is the attachment ticket a snapshot holds while it needs
// a detached volume attached (to be taken, or removed).
func snapshotTicketID(snapshot string) string { return "snapshot-" + snapshot }

// snapshotView is what one snapshot sync knows.
type snapshotView struct {
	vol     *v1beta1.Volume
	eng     *v1beta1.Engine
	info    *v1beta1.SnapshotInfo // the chain's entry; nil when absent
	known   bool                  // the engine has reported a chain at least once
	running bool                  // the engine serves the attached volume: snapshots can be taken
}

func (c *SnapshotController) syncSnapshot(ctx context.Context, key string) error {
	sRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Snapshots, key, func(s *v1beta1.Snapshot) (string, string) {
		vol, err := c.DS.Volumes.GetRO(s.Spec.Volume)
		if err != nil {
			return s.Status.OwnerID, ""
		}
		return s.Status.OwnerID, vol.Status.OwnerID
	})
	if err != nil || !ok {
		return err
	}
	s := sRO.DeepCopy()
	s.Status.OwnerID = c.ControllerID

	vol, err := c.DS.Volumes.GetRO(s.Spec.Volume)
	if apierrors.IsNotFound(err) || (err == nil && vol.DeletionTimestamp != nil) {
		// The volume's data goes with it: nothing to remove in an engine.
		if s.DeletionTimestamp != nil {
			return c.releaseSnapshot(ctx, s)
		}
		if apierrors.IsNotFound(err) {
			s.Status.ReadyToUse, s.Status.Error = false, fmt.Sprintf("volume %s not found", s.Spec.Volume)
			return c.writeSnapshotStatus(ctx, sRO, s)
		}
		return c.DS.Snapshots.Delete(ctx, s.Name)
	}
	if err != nil {
		return err
	}
	view := snapshotView{vol: vol}
	if view.eng, err = c.VolumeEngine(vol); err != nil {
		return err
	}
	if view.eng != nil {
		view.info = view.eng.Status.Snapshots[s.Name]
		view.known = view.eng.Status.Snapshots != nil
		view.running = kit.EngineRunning(view.eng) && vol.Status.CurrentNodeID == view.eng.Spec.NodeID &&
			vol.Status.State == v1beta1.VolumeStateAttached
	}

	if s.DeletionTimestamp != nil {
		if err := c.deleteSnapshot(ctx, s, view); err != nil {
			return fmt.Errorf("snapshot %s: deleting: %w", s.Name, err)
		}
		return nil
	}
	mirrorSnapshot(s, view)
	if view.info == nil && view.known && (!s.Spec.CreateSnapshot || s.Status.CreationTime != "") {
		// Lost: made by the system, or taken once and gone since. Say so,
		// then let it go (the engine monitor's part of the seed).
		if err := c.writeSnapshotStatus(ctx, sRO, s); err != nil {
			return err
		}
		c.Recorder.Event(s, corev1.EventTypeWarning, EventReasonSnapshotLost, snapshotLostMessage)
		err := c.DS.Snapshots.Delete(ctx, s.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}

	var actErr error
	switch {
	case s.Spec.CreateSnapshot && view.info == nil && s.Status.CreationTime == "":
		actErr = c.takeSnapshot(ctx, s, view)
	case view.info != nil:
		actErr = c.RemoveTicket(ctx, vol.Name, snapshotTicketID(s.Name))
	}
	return errors.Join(actErr, c.writeSnapshotStatus(ctx, sRO, s))
}

// mirrorSnapshot copies the chain's entry into the CR's status.
func mirrorSnapshot(s *v1beta1.Snapshot, view snapshotView) {
	info := view.info
	if info == nil {
		s.Status.ReadyToUse = false
		if view.known && (!s.Spec.CreateSnapshot || s.Status.CreationTime != "") {
			s.Status.Error = snapshotLostMessage
		}
		return
	}
	s.Status.Parent = info.Parent
	s.Status.Children = info.Children
	s.Status.MarkRemoved = info.Removed
	s.Status.UserCreated = info.UserCreated
	s.Status.CreationTime = info.Created
	s.Status.Size = info.Size
	s.Status.ExclusiveSize = info.Exclusive
	s.Status.Labels = withoutConsistency(info.Labels)
	s.Status.Consistency = snapshotConsistency(info.Labels)
	s.Status.RestoreSize = view.vol.Status.CurrentSize
	if view.eng.Status.CurrentSize > 0 {
		s.Status.RestoreSize = view.eng.Status.CurrentSize
	}
	s.Status.Error = ""
	s.Status.ReadyToUse = !info.Removed
}

func (c *SnapshotController) writeSnapshotStatus(ctx context.Context, before, s *v1beta1.Snapshot) error {
	if equality.Semantic.DeepEqual(before.Status, s.Status) {
		return nil
	}
	_, err := c.DS.Snapshots.UpdateStatus(ctx, s)
	return err
}

// takeSnapshot takes a requested snapshot once the volume is attached, and
// asks for it to be attached (a snapshot-controller ticket owned by the CR)
// while it is not. A name the engine already has is not taken twice: the
// instance manager refuses it, atomically.
func (c *SnapshotController) takeSnapshot(ctx context.Context, s *v1beta1.Snapshot, view snapshotView) error {
	if !view.running {
		return c.ensureSnapshotTicket(ctx, s, view.vol)
	}
	client, err := c.EngineDataPlane(view.eng)
	if err != nil {
		return err
	}
	_, err = client.SnapshotCreate(ctx, view.eng.Name, s.Name, !s.TakenForStrata(), s.Spec.Labels, fsFreezeFor(c.DS, view.vol))
	switch {
	case err == nil:
		c.Recorder.Eventf(s, corev1.EventTypeNormal, EventReasonSnapshotCreated, "took snapshot %s of volume %s", s.Name, s.Spec.Volume)
	case errors.Is(err, engineapi.ErrAlreadyExists):
	case errors.Is(err, engineapi.ErrLimitExceeded):
		// Retrying will not help until the admin acts; say why in status.
		s.Status.Error = limitRefusal(view, err)
		c.Recorder.Event(s, corev1.EventTypeWarning, EventReasonSnapshotFailed, s.Status.Error)
		return nil
	case errors.Is(err, engineapi.ErrInvalid):
		s.Status.Error = err.Error()
		c.Recorder.Event(s, corev1.EventTypeWarning, EventReasonSnapshotFailed, err.Error())
		return nil
	default:
		return fmt.Errorf("taking snapshot %s: %w", s.Name, err)
	}
	return nil
}

// limitRefusal says why the volume's limits refused a user snapshot: which
// limit, with the figures of the chain as last reported and the field to
// change, then the engine's own words. It begins with
// v1beta1.SnapshotLimitExceeded, which the CSI driver looks for.
func limitRefusal(view snapshotView, err error) string {
	e := view.eng
	userCount, size := e.Status.SnapshotUsage()
	why := fmt.Sprintf("volume %s allows at most %d user snapshots (spec.snapshotMaxCount) and %d bytes of snapshots (spec.snapshotMaxSize, 0: no limit)",
		view.vol.Name, e.Spec.SnapshotMaxCount, e.Spec.SnapshotMaxSize)
	switch {
	case e.Spec.SnapshotMaxCount > 0 && userCount >= int(e.Spec.SnapshotMaxCount):
		why = fmt.Sprintf("volume %s holds %d of at most %d user snapshots (spec.snapshotMaxCount)",
			view.vol.Name, userCount, e.Spec.SnapshotMaxCount)
	case e.Spec.SnapshotMaxSize > 0 && size >= e.Spec.SnapshotMaxSize:
		why = fmt.Sprintf("volume %s's snapshots hold %d of at most %d bytes (spec.snapshotMaxSize)",
			view.vol.Name, size, e.Spec.SnapshotMaxSize)
	}
	return fmt.Sprintf("%s: %s; delete snapshots or raise the limit (engine: %v)",
		v1beta1.SnapshotLimitExceeded, why, err)
}

func (c *SnapshotController) ensureSnapshotTicket(ctx context.Context, s *v1beta1.Snapshot, vol *v1beta1.Volume) error {
	return c.EnsureSnapshotterTicket(ctx, vol, snapshotTicketID(s.Name), "Snapshot", s)
}

// deleteSnapshot removes the snapshot from the chain and purges, attaching
// the volume for it if need be. The finalizer goes once the chain no longer
// holds it, or holds it removed where no purge can drop it now: under the
// live head (a purge prunes it) or with several children. A later purge
// coalesces it once a newer snapshot sits on top.
func (c *SnapshotController) deleteSnapshot(ctx context.Context, s *v1beta1.Snapshot, view snapshotView) error {
	purging := view.eng != nil && kit.IsPurging(view.eng)
	if view.info == nil && s.Spec.CreateSnapshot && view.running {
		// An earlier sync may have taken it before the engine's status
		// says so: make sure, or the engine monitor would give the
		// snapshot a new CR and undo this delete.
		if err := c.removeFromEngine(ctx, s, view); err != nil {
			return err
		}
	}
	if view.info == nil || (view.info.Removed && !purging && !kit.PurgeDrops(view.info)) {
		return c.releaseSnapshot(ctx, s)
	}
	if !view.running {
		return c.ensureSnapshotTicket(ctx, s, view.vol)
	}
	if !view.info.Removed {
		// The readers' progress enqueues it again (snapshot_controller_base).
		if who := kit.SnapshotReaders(c.DS, s.Spec.Volume).Describe(s.Name); who != "" {
			c.Recorder.Event(s, corev1.EventTypeNormal, EventReasonSnapshotWaiting, kit.WaitingForReaders(s.Name, who))
			return nil
		}
		if err := c.removeFromEngine(ctx, s, view); err != nil {
			return err
		}
	}
	if noPurge, _ := c.DS.GetSettingBool(types.SettingDisableSnapshotPurge); noPurge || purging {
		return nil
	}
	client, err := c.EngineDataPlane(view.eng)
	if err != nil {
		return err
	}
	if err := client.SnapshotPurge(ctx, view.eng.Name); err != nil && !errors.Is(err, engineapi.ErrBusy) {
		return fmt.Errorf("purging volume %s: %w", s.Spec.Volume, err)
	}
	return nil
}

// removeFromEngine marks the snapshot removed in the engine; one the engine
// does not have is fine.
func (c *SnapshotController) removeFromEngine(ctx context.Context, s *v1beta1.Snapshot, view snapshotView) error {
	client, err := c.EngineDataPlane(view.eng)
	if err != nil {
		return err
	}
	err = client.SnapshotRemove(ctx, view.eng.Name, s.Name)
	switch {
	case errors.Is(err, engineapi.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("removing snapshot %s: %w", s.Name, err)
	}
	c.Recorder.Eventf(s, corev1.EventTypeNormal, EventReasonSnapshotRemoved, "removed snapshot %s from volume %s", s.Name, s.Spec.Volume)
	return nil
}

// releaseSnapshot drops the snapshot's ticket and finalizer.
func (c *SnapshotController) releaseSnapshot(ctx context.Context, s *v1beta1.Snapshot) error {
	if err := c.RemoveTicket(ctx, s.Spec.Volume, snapshotTicketID(s.Name)); err != nil {
		return err
	}
	_, err := c.DS.Snapshots.RemoveFinalizer(ctx, s, types.FinalizerName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// syncEngineSnapshots gives every snapshot in an engine's chain a CR
// (createSnapshot false: the controller only mirrors it). The live head
// and snapshots already removed get none.
func (c *SnapshotController) syncEngineSnapshots(ctx context.Context, key string) error {
	eRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Engines, key, func(e *v1beta1.Engine) (string, string) {
		vol, err := c.DS.Volumes.GetRO(e.Spec.VolumeName)
		if err != nil {
			return e.Status.OwnerID, ""
		}
		return vol.Status.OwnerID, vol.Status.OwnerID
	})
	if err != nil || !ok || eRO.DeletionTimestamp != nil {
		return err
	}
	vol, err := c.DS.Volumes.GetRO(eRO.Spec.VolumeName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil || vol.DeletionTimestamp != nil {
		return err
	}
	if primary, err := c.VolumeEngine(vol); err != nil || primary == nil || primary.Name != eRO.Name {
		return err // a migration engine's chain is the same chain
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(eRO.Status.Snapshots)) {
		info := eRO.Status.Snapshots[name]
		if name == types.VolumeHeadName || info == nil || info.Removed {
			continue
		}
		if _, err := c.DS.Snapshots.GetRO(name); err == nil || !apierrors.IsNotFound(err) {
			continue
		}
		snap := &v1beta1.Snapshot{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: vol.Namespace,
				Labels:     map[string]string{types.LabelVolume: vol.Name},
				Finalizers: []string{types.FinalizerName},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Volume",
					Name: vol.Name, UID: vol.UID}}},
			Spec: v1beta1.SnapshotSpec{Volume: vol.Name, CreateSnapshot: false, Labels: info.Labels},
		}
		c.joinGroup(snap)
		if _, err := c.DS.Snapshots.Create(ctx, snap); err != nil && !apierrors.IsAlreadyExists(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons and the condition of the clone controller.
const (
	EventReasonCloneStarted   = "CloneStarted"
	EventReasonCloneCompleted = "CloneCompleted"
	EventReasonCloneFailed    = "CloneFailed"

	// VolumeConditionCloned is true once the data source is copied in.
	VolumeConditionCloned = "Cloned"

	// cloneTimeout bounds one SnapshotClone call; a copy that takes longer
	// is cancelled and started over (the instance manager zeroes first).
	cloneTimeout = 6 * time.Hour
)

// cloneTicketID is the ticket a clone target holds on itself and on its source.
func cloneTicketID(target string) string { return "clone-" + target }

// cloneSnapshotName is the snapshot taken of a whole source volume for the
// clone target: one name per target, so a retried sync finds it.
func cloneSnapshotName(target string) string {
	if name := "clone-" + target; len(name) <= 63 {
		return name
	}
	return kit.DerivedSnapshotName("clone", target)
}

// cloneSync is what one sync of a clone target knows.
type cloneSync struct {
	target *v1beta1.Volume // a copy; its status is written at the end
	status *v1beta1.VolumeCloneStatus
	source types.DataSource
	snap   string // the snapshot copied
	// tookResult: this sync applied a finished copy's outcome, which is
	// forgotten once the status saying so is written.
	tookResult bool
}

func (c *VolumeCloneController) syncClone(ctx context.Context, key string) error {
	vRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Volumes, key, func(v *v1beta1.Volume) (string, string) {
		return v.Status.OwnerID, v.Status.OwnerID
	})
	if err != nil || !ok || vRO.Spec.DataSource == "" {
		return err
	}
	v := vRO.DeepCopy()
	if v.DeletionTimestamp != nil {
		c.cancelCopy(v)
		return c.release(ctx, v)
	}
	if v.Status.CloneStatus == nil {
		v.Status.CloneStatus = &v1beta1.VolumeCloneStatus{State: v1beta1.VolumeCloneStatePending}
	}
	s := &cloneSync{target: v, status: v.Status.CloneStatus}
	actErr := c.reconcileClone(ctx, s)
	c.setClonedCondition(v)
	if !equality.Semantic.DeepEqual(vRO.Status, v.Status) {
		if _, err := c.DS.Volumes.UpdateStatus(ctx, v); err != nil {
			// A copy's outcome stays for the retry: losing it would start
			// the copy over.
			return errors.Join(actErr, err)
		}
	}
	if s.tookResult && !finalCloneState(v.Status.CloneStatus.State) {
		// A retry: the next sync starts a new copy.
		c.forgetResult(v)
	}
	return actErr
}

// finalCloneState: nothing more to copy. A copy's outcome that led here is
// kept until the cache shows this state (release forgets it): a sync that
// read the volume before the write would otherwise start the copy again.
func finalCloneState(s v1beta1.VolumeCloneState) bool {
	return s == v1beta1.VolumeCloneStateCompleted || s == v1beta1.VolumeCloneStateFailed
}

func (c *VolumeCloneController) reconcileClone(ctx context.Context, s *cloneSync) error {
	if finalCloneState(s.status.State) {
		c.forgetResult(s.target)
		return c.release(ctx, s.target)
	}
	src, ok := types.ParseDataSource(s.target.Spec.DataSource)
	if !ok {
		return c.fail(ctx, s, fmt.Sprintf("spec.dataSource %q is not a data source", s.target.Spec.DataSource))
	}
	s.source, s.snap = src, src.Snapshot
	if s.snap == "" {
		s.snap = cloneSnapshotName(s.target.Name)
	}
	s.status.SourceVolume, s.status.Snapshot = src.Volume, s.snap
	if done, err := c.takeCopyResult(ctx, s); done || err != nil {
		return err
	}

	source, err := c.DS.Volumes.GetRO(src.Volume)
	if apierrors.IsNotFound(err) || (err == nil && source.DeletionTimestamp != nil) {
		return c.fail(ctx, s, fmt.Sprintf("source volume %s went away before the clone completed", src.Volume))
	}
	if err != nil {
		return err
	}
	if ready, err := c.sourceSnapshotReady(ctx, s); !ready || err != nil {
		return err
	}
	if err := c.ensureCloneTickets(ctx, s, source); err != nil {
		return err
	}
	return c.startCopy(s, source)
}

// sourceSnapshotReady makes sure the snapshot to copy exists and is ready:
// for a whole volume it is taken for the clone (a Snapshot CR owned by the
// target, so it goes with it).
func (c *VolumeCloneController) sourceSnapshotReady(ctx context.Context, s *cloneSync) (bool, error) {
	snap, err := c.DS.Snapshots.GetRO(s.snap)
	switch {
	case apierrors.IsNotFound(err) && s.source.Snapshot == "":
		s.status.Message = fmt.Sprintf("taking snapshot %s of volume %s", s.snap, s.source.Volume)
		return false, c.createCloneSnapshot(ctx, s)
	case apierrors.IsNotFound(err) || (err == nil && snap.DeletionTimestamp != nil):
		return false, c.fail(ctx, s, fmt.Sprintf("source snapshot %s of volume %s went away before the clone completed",
			s.snap, s.source.Volume))
	case err != nil:
		return false, err
	case snap.Spec.Volume != s.source.Volume:
		return false, c.fail(ctx, s, fmt.Sprintf("snapshot %s belongs to volume %s, not %s", s.snap, snap.Spec.Volume, s.source.Volume))
	case snap.Status.Error != "" && !snap.Status.ReadyToUse:
		return false, c.fail(ctx, s, fmt.Sprintf("source snapshot %s: %s", s.snap, snap.Status.Error))
	case !snap.Status.ReadyToUse:
		s.status.Message = fmt.Sprintf("waiting for snapshot %s of volume %s to be ready", s.snap, s.source.Volume)
		return false, nil
	}
	return true, nil
}

func (c *VolumeCloneController) createCloneSnapshot(ctx context.Context, s *cloneSync) error {
	t := s.target
	snap := &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: s.snap, Namespace: t.Namespace,
			Labels: map[string]string{types.LabelVolume: s.source.Volume},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Volume",
				Name: t.Name, UID: t.UID}}},
		Spec: v1beta1.SnapshotSpec{Volume: s.source.Volume, CreateSnapshot: true,
			Labels: map[string]string{"strata.io/clone-target": t.Name}},
	}
	_, err := c.DS.Snapshots.Create(ctx, snap)
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ensureCloneTickets attaches the target (frontend off: nothing may read it
// yet) and the source (any frontend: a workload may be using it) through
// tickets owned by the target. The source stays where it is attached.
func (c *VolumeCloneController) ensureCloneTickets(ctx context.Context, s *cloneSync, source *v1beta1.Volume) error {
	t := s.target
	owner := &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Volume",
		Namespace: t.Namespace, Name: t.Name, UID: string(t.UID)}
	node := t.Spec.NodeID
	if node == "" {
		node = c.ControllerID
	}
	sourceNode := source.Spec.NodeID
	if sourceNode == "" {
		sourceNode = node
	}
	return errors.Join(
		c.EnsureTicket(ctx, t.Name, &v1beta1.AttachmentTicket{ID: cloneTicketID(t.Name),
			Type: v1beta1.AttacherTypeVolumeCloneController, NodeID: node, OwnerRef: owner,
			Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.TrueValue}}),
		c.EnsureTicket(ctx, source.Name, &v1beta1.AttachmentTicket{ID: cloneTicketID(t.Name),
			Type: v1beta1.AttacherTypeVolumeCloneController, NodeID: sourceNode, OwnerRef: owner,
			Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.AnyValue}}))
}

// startCopy starts the data plane's copy once the target's engine runs
// without a frontend and the source has a healthy replica to read from;
// while it runs it mirrors the engine's progress.
func (c *VolumeCloneController) startCopy(s *cloneSync, source *v1beta1.Volume) error {
	targetEng, ok, why, err := c.cloneTargetEngine(s.target)
	if err != nil || !ok {
		s.status.State, s.status.Message = v1beta1.VolumeCloneStatePending, why
		return err
	}
	sourceAddr, why, err := c.cloneSourceAddress(source)
	if err != nil || sourceAddr == "" {
		s.status.State, s.status.Message = v1beta1.VolumeCloneStatePending, why
		return err
	}
	if c.copyRunning(s.target) {
		if cs := targetEng.Status.CloneStatus; cs != nil && cs.Snapshot == s.snap {
			s.status.Progress = cs.Progress
		}
		s.status.State, s.status.Message = v1beta1.VolumeCloneStateCopying, ""
		return nil
	}
	client, err := c.EngineDataPlane(targetEng)
	if err != nil {
		return err
	}
	// Both on the same backing image: each replica has its disk's copy, so
	// only the layers above it travel.
	shared := source.Spec.BackingImage != "" && source.Spec.BackingImage == s.target.Spec.BackingImage
	if !c.runCopy(s.target, client, engineapi.SnapshotCloneArgs{Engine: targetEng.Name, SourceAddress: sourceAddr,
		Snapshot: s.snap, BackingShared: shared}) {
		return nil // the copy ended meanwhile: its outcome requeued the volume
	}
	s.status.State, s.status.Message, s.status.Progress = v1beta1.VolumeCloneStateCopying, "", 0
	s.status.Attempts++
	c.Recorder.Eventf(s.target, corev1.EventTypeNormal, EventReasonCloneStarted,
		"copying snapshot %s of volume %s (attempt %d)", s.snap, source.Name, s.status.Attempts)
	return nil
}

// cloneTargetEngine is the target's engine once it runs attached with its
// frontend off, or why not yet.
func (c *VolumeCloneController) cloneTargetEngine(t *v1beta1.Volume) (*v1beta1.Engine, bool, string, error) {
	e, err := c.VolumeEngine(t)
	if err != nil {
		return nil, false, "", err
	}
	if t.Status.State != v1beta1.VolumeStateAttached || e == nil || !kit.EngineRunning(e) ||
		t.Status.CurrentNodeID != e.Spec.NodeID {
		return nil, false, fmt.Sprintf("waiting for volume %s to attach for the clone (now %s)", t.Name, kit.OrUnknown(string(t.Status.State))), nil
	}
	if e.Status.Endpoint != "" {
		return nil, false, fmt.Sprintf("waiting for volume %s's frontend to stop", t.Name), nil
	}
	return e, true, "", nil
}

// cloneSourceAddress is the data address of a healthy replica of the
// attached source, or why there is none yet.
func (c *VolumeCloneController) cloneSourceAddress(source *v1beta1.Volume) (string, string, error) {
	e, err := c.VolumeEngine(source)
	if err != nil {
		return "", "", err
	}
	if source.Status.State != v1beta1.VolumeStateAttached || e == nil || !kit.EngineRunning(e) {
		return "", fmt.Sprintf("waiting for source volume %s to attach (now %s)", source.Name, kit.OrUnknown(string(source.Status.State))), nil
	}
	for _, r := range slices.Sorted(maps.Keys(e.Status.ReplicaModeMap)) {
		if e.Status.ReplicaModeMap[r] == v1beta1.ReplicaModeRW && e.Status.CurrentReplicaAddressMap[r] != "" {
			return e.Status.CurrentReplicaAddressMap[r], "", nil
		}
	}
	return "", fmt.Sprintf("source volume %s has no healthy replica to read from", source.Name), nil
}

// takeCopyResult applies how a finished copy ended: completed, failed for
// good (the source cannot be copied into this volume), or retried.
func (c *VolumeCloneController) takeCopyResult(ctx context.Context, s *cloneSync) (bool, error) {
	err, finished, seen := c.copyResult(s.target)
	if !finished {
		return false, nil
	}
	s.tookResult = true
	switch {
	case err == nil:
		// The tickets go on the next sync, once this state is stored: the
		// volume must not detach while its status still says copying.
		s.status.State, s.status.Progress, s.status.Message = v1beta1.VolumeCloneStateCompleted, 100, ""
		if !seen {
			c.Recorder.Eventf(s.target, corev1.EventTypeNormal, EventReasonCloneCompleted,
				"copied snapshot %s of volume %s", s.snap, s.source.Volume)
		}
		return true, nil
	case errors.Is(err, engineapi.ErrInvalid) || errors.Is(err, engineapi.ErrNotFound):
		return true, c.fail(ctx, s, err.Error())
	}
	s.status.State, s.status.Message = v1beta1.VolumeCloneStatePending, "the last copy failed and is retried: "+err.Error()
	c.Recorder.Event(s.target, corev1.EventTypeWarning, EventReasonCloneFailed, s.status.Message)
	return true, fmt.Errorf("clone into %s: %w", s.target.Name, err)
}

// fail ends the clone for good: the volume stays unattachable for workloads
// and says why; deleting it is the way out. The tickets go on the next sync,
// once the state is stored.
func (c *VolumeCloneController) fail(_ context.Context, s *cloneSync, msg string) error {
	if s.status.State != v1beta1.VolumeCloneStateFailed {
		c.Recorder.Event(s.target, corev1.EventTypeWarning, EventReasonCloneFailed, msg)
	}
	s.status.State, s.status.Message = v1beta1.VolumeCloneStateFailed, msg
	return nil
}

// release drops the clone's tickets and the snapshot taken for it.
func (c *VolumeCloneController) release(ctx context.Context, t *v1beta1.Volume) error {
	var errs []error
	errs = append(errs, c.RemoveTicket(ctx, t.Name, cloneTicketID(t.Name)))
	if src, ok := types.ParseDataSource(t.Spec.DataSource); ok {
		errs = append(errs, c.RemoveTicket(ctx, src.Volume, cloneTicketID(t.Name)))
		if _, err := c.DS.Snapshots.GetRO(cloneSnapshotName(t.Name)); src.Snapshot == "" && err == nil {
			err := c.DS.Snapshots.Delete(ctx, cloneSnapshotName(t.Name))
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (c *VolumeCloneController) setClonedCondition(v *v1beta1.Volume) {
	cs := v.Status.CloneStatus
	now := metav1.NewTime(time.Now())
	switch cs.State {
	case v1beta1.VolumeCloneStateCompleted:
		kit.SetCondition(&v.Status.Conditions, VolumeConditionCloned, true, "CloneCompleted",
			fmt.Sprintf("filled from %s", v.Spec.DataSource), now)
	case v1beta1.VolumeCloneStateFailed:
		kit.SetCondition(&v.Status.Conditions, VolumeConditionCloned, false, "CloneFailed", cs.Message, now)
	default:
		kit.SetCondition(&v.Status.Conditions, VolumeConditionCloned, false, "CloneInProgress",
			fmt.Sprintf("filling from %s: %s", v.Spec.DataSource, kit.OrUnknown(string(cs.State))), now)
	}
}

// syncCloneSnapshot deletes a snapshot taken for a clone whose target is
// gone. The target owns it, but the source volume does too (the snapshot
// webhook makes the volume an owner), so garbage collection alone would
// keep it as long as the source lives.
func (c *VolumeCloneController) syncCloneSnapshot(ctx context.Context, key string) error {
	snap, ok, err := kit.GetResponsible(c.BaseController, c.DS.Snapshots, key, func(s *v1beta1.Snapshot) (string, string) {
		return s.Status.OwnerID, ""
	})
	if err != nil || !ok || snap.DeletionTimestamp != nil {
		return err
	}
	for _, ref := range snap.OwnerReferences {
		if ref.Kind != "Volume" || ref.Name == snap.Spec.Volume {
			continue
		}
		target, err := c.DS.Volumes.GetRO(ref.Name)
		if err == nil && target.UID == ref.UID && target.DeletionTimestamp == nil {
			return nil // its clone is still being made, or it is done and will delete it
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		err = c.DS.Snapshots.Delete(ctx, snap.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	return nil
}

package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Volume event reasons.
const (
	EventReasonVolumeAttached    = "Attached"
	EventReasonVolumeDetached    = "Detached"
	EventReasonVolumeDegraded    = "Degraded"
	EventReasonVolumeHealthy     = "Healthy"
	EventReasonVolumeFaulted     = "Faulted"
	EventReasonVolumeSalvaged    = "Salvaged"
	EventReasonVolumeExpanded    = "Expanded"
	EventReasonReplicaScheduled  = "ReplicaScheduled"
	EventReasonReplicaFailed     = "ReplicaFailed"
	EventReasonReplicaReused     = "ReplicaReused"
	EventReasonReplicaUnschedule = "ReplicaUnschedulable"
	// EventReasonReplicaLocal: a replica where the volume is attached holds
	// the data, and one elsewhere was removed (dataLocality best-effort).
	EventReasonReplicaLocal  = "ReplicaMadeLocal"
	EventReasonMigrated      = "Migrated"
	EventReasonSnapshotLimit = "SnapshotLimit"
	EventReasonSpaceRetained = "SnapshotSpaceRetained"

	// unschedulableRetry is how soon a volume missing replicas tries to
	// place them again; node and disk changes do not enqueue every volume.
	unschedulableRetry = 15 * time.Second
)

// volumeSync is one pass of the volume controller over one volume: the
// volume as read (vRO), the copy whose status the pass builds (v), and the
// volume's engines and replicas from the by-volume indexes.
type volumeSync struct {
	*VolumeController
	ctx      context.Context
	key      string
	vRO, v   *v1beta1.Volume
	engines  []*v1beta1.Engine
	replicas []*v1beta1.Replica
	now      time.Time
}

func (c *VolumeController) syncVolume(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	vRO, err := c.DS.Volumes.GetRO(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	preferred := vRO.Spec.NodeID
	if preferred == "" {
		preferred = vRO.Status.CurrentNodeID
	}
	if ok, err := c.IsResponsibleFor(key, vRO.Status.OwnerID, preferred); err != nil || !ok {
		return err
	}
	s := &volumeSync{VolumeController: c, ctx: ctx, key: key, vRO: vRO, v: vRO.DeepCopy(), now: c.DS.Clock.Now()}
	s.v.Status.OwnerID = c.ControllerID
	if s.engines, err = c.DS.Engines.ListByIndexRO(datastore.IndexByVolume, name); err != nil {
		return err
	}
	if s.replicas, err = c.DS.Replicas.ListByIndexRO(datastore.IndexByVolume, name); err != nil {
		return err
	}
	slices.SortFunc(s.engines, byName[*v1beta1.Engine])
	slices.SortFunc(s.replicas, byName[*v1beta1.Replica])
	if c.created.unseen(name, s.replicas, s.now) {
		// A sync on a cache without the replica the last one created would
		// place another, maybe on the same node: wait for the cache.
		c.Queue.AddAfter(key, cacheCatchUpDelay)
		return nil
	}

	if vRO.DeletionTimestamp != nil {
		done, err := s.deleteVolume()
		if err != nil {
			return fmt.Errorf("volume %s: deleting: %w", name, err)
		}
		if done {
			return nil
		}
		return s.writeStatus()
	}
	if !slices.Contains(vRO.Finalizers, types.FinalizerName) {
		// The mutating webhook adds it on create; this covers volumes
		// created while no webhook answered. The update enqueues us again.
		_, err := c.DS.Volumes.AddFinalizer(ctx, vRO, types.FinalizerName)
		return err
	}
	err = s.reconcile()
	return errors.Join(err, s.writeStatus())
}

func byName[T metav1.Object](a, b T) int {
	switch {
	case a.GetName() < b.GetName():
		return -1
	case a.GetName() > b.GetName():
		return 1
	}
	return 0
}

func (s *volumeSync) reconcile() error {
	v := s.v
	if v.Status.CurrentSize == 0 {
		v.Status.CurrentSize = s.specSize()
	}
	if v.Status.State == "" {
		v.Status.State = v1beta1.VolumeStateCreating
	}
	s.updateBackingImageCondition()
	if err := s.ensureEngine(); err != nil {
		return fmt.Errorf("volume %s: ensuring its engine: %w", v.Name, err)
	}
	if err := s.reconcileReplicas(); err != nil {
		return fmt.Errorf("volume %s: reconciling its replicas: %w", v.Name, err)
	}
	if err := s.reconcileAttachment(); err != nil {
		return fmt.Errorf("volume %s: attaching or detaching: %w", v.Name, err)
	}
	s.updateRobustness()
	s.updateSnapshotLimitCondition()
	s.updateSpaceRetainedCondition()
	s.updateActualSize()
	return nil
}

// updateActualSize follows the engine's chain sizes, which the instance
// manager publishes only when they change (at most once per its size report
// interval), so this writes nothing in a quiet minute.
func (s *volumeSync) updateActualSize() {
	if e := s.primaryEngine(); e != nil {
		if sp, ok := e.Status.Space(); ok {
			s.v.Status.ActualSize = sp.Total()
			s.v.Status.HeadSize, s.v.Status.SnapshotsSize, s.v.Status.RemovedSnapshotsSize = sp.Head, sp.Snapshots, sp.Removed
		}
	}
}

// specSize is the volume's size in bytes, rounded up to the data plane's 4 KiB block.
func (s *volumeSync) specSize() int64 {
	const block = 4096
	size := s.v.Spec.Size.Value()
	return (size + block - 1) / block * block
}

func (s *volumeSync) writeStatus() error {
	if equality.Semantic.DeepEqual(s.vRO.Status, s.v.Status) {
		return nil
	}
	updated, err := s.DS.Volumes.UpdateStatus(s.ctx, s.v)
	if err != nil {
		return err
	}
	s.statusEvents(s.vRO, updated)
	// Later writes of the same pass go on top of this one.
	s.vRO = updated
	s.v.ResourceVersion = updated.ResourceVersion
	return nil
}

// statusEvents tells what changed for an admin reading `kubectl describe`.
func (s *volumeSync) statusEvents(old, cur *v1beta1.Volume) {
	if old.Status.State != cur.Status.State {
		switch cur.Status.State {
		case v1beta1.VolumeStateAttached:
			s.Recorder.Eventf(cur, corev1.EventTypeNormal, EventReasonVolumeAttached, "attached to %s", cur.Status.CurrentNodeID)
		case v1beta1.VolumeStateDetached:
			if old.Status.State != v1beta1.VolumeStateCreating && old.Status.State != "" {
				s.Recorder.Event(cur, corev1.EventTypeNormal, EventReasonVolumeDetached, "detached")
			}
		}
	}
	// SnapshotLimit warns when it turns True or moves from near a limit to
	// at it: the admin learns before (or as) user snapshots are refused,
	// not from a failed backup. SnapshotSpaceRetained, when purge being
	// disabled starts keeping deleted snapshots' data.
	s.conditionWarning(old, cur, v1beta1.VolumeConditionSnapshotLimit, EventReasonSnapshotLimit)
	s.conditionWarning(old, cur, v1beta1.VolumeConditionSnapshotSpaceRetained, EventReasonSpaceRetained)
	s.backingImageEvent(old, cur)
	if old.Status.Robustness != cur.Status.Robustness {
		switch cur.Status.Robustness {
		case v1beta1.VolumeRobustnessDegraded:
			s.Recorder.Event(cur, corev1.EventTypeWarning, EventReasonVolumeDegraded, "fewer healthy replicas than spec.numberOfReplicas")
		case v1beta1.VolumeRobustnessFaulted:
			s.Recorder.Event(cur, corev1.EventTypeWarning, EventReasonVolumeFaulted, "no healthy replica")
		case v1beta1.VolumeRobustnessHealthy:
			if old.Status.Robustness != "" {
				s.Recorder.Event(cur, corev1.EventTypeNormal, EventReasonVolumeHealthy, "every replica is healthy")
			}
		}
	}
}

// conditionWarning warns with condType's message when it turns True or,
// True already, changes reason; not at every status write.
func (s *volumeSync) conditionWarning(old, cur *v1beta1.Volume, condType, eventReason string) {
	c := meta.FindStatusCondition(cur.Status.Conditions, condType)
	if c == nil || c.Status != metav1.ConditionTrue {
		return
	}
	if o := meta.FindStatusCondition(old.Status.Conditions, condType); o != nil && o.Status == c.Status && o.Reason == c.Reason {
		return
	}
	s.Recorder.Event(cur, corev1.EventTypeWarning, eventReason, c.Message)
}

func (s *volumeSync) setCondition(condType string, ok bool, reason, message string) {
	kit.SetCondition(&s.v.Status.Conditions, condType, ok, reason, message, metav1.NewTime(s.now))
}

// deleteVolume deletes the engines and replicas (their controllers stop the
// instances and delete the replicas' data) and lets the volume go once they
// are gone. done says the volume's finalizer was removed.
func (s *volumeSync) deleteVolume() (done bool, err error) {
	s.v.Status.State = v1beta1.VolumeStateDeleting
	// Snapshots go first: each CR's finalizer waits for its controller,
	// which lets it go at once for a volume being deleted.
	snaps, err := s.DS.Snapshots.ListByIndexRO(datastore.IndexByVolume, s.v.Name)
	if err != nil {
		return false, err
	}
	for _, snap := range snaps {
		if snap.DeletionTimestamp == nil {
			if err := s.DS.Snapshots.Delete(s.ctx, snap.Name); err != nil {
				return false, err
			}
		}
	}
	if len(snaps) > 0 {
		return false, nil // their deletion events bring us back
	}
	for _, e := range s.engines {
		if e.DeletionTimestamp == nil {
			if err := s.DS.Engines.Delete(s.ctx, e.Name); err != nil {
				return false, err
			}
		}
	}
	for _, r := range s.replicas {
		if r.DeletionTimestamp == nil {
			if err := s.DS.Replicas.Delete(s.ctx, r.Name); err != nil {
				return false, err
			}
		}
	}
	if len(s.engines)+len(s.replicas) > 0 {
		return false, nil // their deletion events bring us back
	}
	_, err = s.DS.Volumes.RemoveFinalizer(s.ctx, s.vRO, types.FinalizerName)
	if apierrors.IsNotFound(err) {
		err = nil
	}
	return true, err
}

// ensureEngine creates the volume's engine when it has none. The engine
// stays stopped until the volume attaches.
func (s *volumeSync) ensureEngine() error {
	if len(s.engines) > 0 {
		return nil
	}
	e, err := s.DS.Engines.Create(s.ctx, s.newEngine(""))
	if err != nil {
		return err
	}
	s.engines = append(s.engines, e)
	return nil
}

func (s *volumeSync) newEngine(nodeID string) *v1beta1.Engine {
	v := s.v
	desire := v1beta1.InstanceStateStopped
	if nodeID != "" {
		desire = v1beta1.InstanceStateRunning
	}
	return &v1beta1.Engine{
		ObjectMeta: s.childMeta(v.Name + "-e-" + randomSuffix()),
		Spec: v1beta1.EngineSpec{
			InstanceSpec: v1beta1.InstanceSpec{VolumeName: v.Name, VolumeSize: v.Status.CurrentSize, NodeID: nodeID,
				DesireState: desire, BackingImage: v.Spec.BackingImage},
			Frontend: v.Spec.Frontend, DisableFrontend: v.Spec.DisableFrontend,
		},
	}
}

// childMeta is the metadata of an engine or replica of the volume: its
// label, the cleanup finalizer, and the volume as owner.
func (s *volumeSync) childMeta(name string) metav1.ObjectMeta {
	v := s.v
	return metav1.ObjectMeta{
		Name: name, Namespace: v.Namespace,
		Labels:          map[string]string{types.LabelVolume: v.Name},
		Finalizers:      []string{types.FinalizerName},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(v, v1beta1.SchemeGroupVersion.WithKind("Volume"))},
	}
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// updateEngine writes an engine's spec if the pass changed it.
func (s *volumeSync) updateEngine(before, after *v1beta1.Engine) (*v1beta1.Engine, error) {
	if equality.Semantic.DeepEqual(before.Spec, after.Spec) {
		return before, nil
	}
	updated, err := s.DS.Engines.Update(s.ctx, after)
	if err != nil {
		return before, err
	}
	s.replaceEngine(updated)
	return updated, nil
}

func (s *volumeSync) replaceEngine(e *v1beta1.Engine) {
	for i := range s.engines {
		if s.engines[i].Name == e.Name {
			s.engines[i] = e
		}
	}
}

// updateReplica writes a replica's spec if the pass changed it.
func (s *volumeSync) updateReplica(before, after *v1beta1.Replica) (*v1beta1.Replica, error) {
	if equality.Semantic.DeepEqual(before.Spec, after.Spec) {
		return before, nil
	}
	updated, err := s.DS.Replicas.Update(s.ctx, after)
	if err != nil {
		return before, err
	}
	for i := range s.replicas {
		if s.replicas[i].Name == updated.Name {
			s.replicas[i] = updated
		}
	}
	return updated, nil
}

// updateSnapshotLimitCondition judges the chain the engine last reported
// (its cached status: no gRPC) against the limits the engine is given.
// The condition changes only when the limits change or the chain comes
// near them, so neither a volume's writes (the head does not count) nor
// its snapshots far from the limits cost a status write.
func (s *volumeSync) updateSnapshotLimitCondition() {
	var userCount int
	var size int64
	if e := s.primaryEngine(); e != nil {
		userCount, size = e.Status.SnapshotUsage()
	}
	ok, reason, message := snapshotLimitCondition(s.snapshotMaxCount(), s.v.Spec.SnapshotMaxSize.Value(), userCount, size)
	s.setCondition(v1beta1.VolumeConditionSnapshotLimit, ok, reason, message)
}

// snapshotLimitCondition is True when the next user snapshot would be
// refused (the data plane refuses one at count >= maxCount or size >=
// maxSize), or is near that: one user snapshot left under the count limit,
// or snapshots holding 90% or more of the size limit. Near warns while
// there is still room; the next snapshot or the data written since the
// last one reaches the limit. 0 is no limit. Pure, so table-tested.
func snapshotLimitCondition(maxCount int32, maxSize int64, userCount int, size int64) (bool, string, string) {
	count := fmt.Sprintf("%d user snapshots, no count limit", userCount)
	countReached, countNear := false, false
	if maxCount > 0 {
		count = fmt.Sprintf("%d of %d user snapshots", userCount, maxCount)
		countReached, countNear = userCount >= int(maxCount), userCount == int(maxCount)-1
	}
	held := fmt.Sprintf("snapshots hold %s, no size limit", types.ApproxBytes(size))
	sizeReached, sizeNear := false, false
	if maxSize > 0 {
		held = fmt.Sprintf("snapshots hold %s of %s", types.ApproxBytes(size), types.ApproxBytes(maxSize))
		sizeReached, sizeNear = size >= maxSize, size >= maxSize-maxSize/10
	}
	const refused = ": the next user snapshot will be refused"
	switch {
	case countReached:
		return true, v1beta1.SnapshotLimitReasonCountReached, count + " (spec.snapshotMaxCount)" + refused + "; " + held
	case sizeReached:
		return true, v1beta1.SnapshotLimitReasonSizeReached, count + "; " + held + " (spec.snapshotMaxSize)" + refused
	case countNear:
		return true, v1beta1.SnapshotLimitReasonCountNear, count + " (spec.snapshotMaxCount): one more is allowed; " + held
	case sizeNear:
		return true, v1beta1.SnapshotLimitReasonSizeNear, count + "; " + held + " (spec.snapshotMaxSize): 90% or more used"
	}
	// Within the limits the message names the limits only: figures that
	// move with every snapshot would cost a Volume write per snapshot.
	return false, v1beta1.SnapshotLimitReasonWithin, withinLimitsMessage(maxCount, maxSize)
}

func withinLimitsMessage(maxCount int32, maxSize int64) string {
	count, size := "no count limit", "no size limit"
	if maxCount > 0 {
		count = fmt.Sprintf("under %d user snapshots (spec.snapshotMaxCount)", maxCount)
	}
	if maxSize > 0 {
		size = fmt.Sprintf("under %s of snapshots (spec.snapshotMaxSize)", types.ApproxBytes(maxSize))
	}
	return count + "; " + size
}

// updateSpaceRetainedCondition says when removed snapshots keep space only
// because snapshot purge is disabled: deleted snapshots' data a purge
// would free, by the engine's last chain.
func (s *volumeSync) updateSpaceRetainedCondition() {
	var held int64
	var names []string
	if e := s.primaryEngine(); e != nil {
		held, names = e.Status.RemovedExclusive()
	}
	noPurge, _ := s.DS.GetSettingBool(types.SettingDisableSnapshotPurge)
	ok, reason, message := spaceRetainedCondition(noPurge, held, names)
	s.setCondition(v1beta1.VolumeConditionSnapshotSpaceRetained, ok, reason, message)
}

// spaceRetainedCondition is pure, so table-tested.
func spaceRetainedCondition(noPurge bool, held int64, removed []string) (bool, string, string) {
	switch {
	case !noPurge:
		return false, "PurgeEnabled", "deleted snapshots' data is freed by a purge"
	case held == 0:
		return false, "NothingRetained", "snapshot purge is disabled; no deleted snapshot holds data a purge would free"
	}
	slices.Sort(removed)
	return true, "PurgeDisabled", fmt.Sprintf("deleted snapshots %s hold %s (%d bytes) that a purge would free; "+
		"snapshot purge is disabled (setting %s)", strings.Join(removed, ", "), types.ApproxBytes(held), held,
		types.SettingDisableSnapshotPurge)
}

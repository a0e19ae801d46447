package volume

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	corev1 "k8s.io/api/core/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/scheduler"
	"github.com/strata-storage/strata/types"
)

// usable tells a replica that counts for the volume: not failed, not going.
func usable(r *v1beta1.Replica) bool { return r.DeletionTimestamp == nil && r.Spec.FailedAt == "" }

// rebuilt tells a usable replica that has held the volume's data with the
// engine (RW) at least once.
func rebuilt(r *v1beta1.Replica) bool { return usable(r) && r.Spec.HealthyAt != "" }

func (s *volumeSync) replicasWhere(pred func(*v1beta1.Replica) bool) []*v1beta1.Replica {
	var out []*v1beta1.Replica
	for _, r := range s.replicas {
		if pred(r) {
			out = append(out, r)
		}
	}
	return out
}

func (s *volumeSync) desiredReplicaCount() int {
	if n := s.v.Spec.NumberOfReplicas; n > 0 {
		return int(n)
	}
	n, err := s.DS.GetSettingInt(types.SettingDefaultReplicaCount)
	if err != nil || n < 1 {
		return 3
	}
	return int(n)
}

// reconcileReplicas records failures, marks rebuilt replicas healthy,
// schedules missing replicas and replaces failed ones.
func (s *volumeSync) reconcileReplicas() error {
	eng := s.primaryEngine()
	running := kit.EngineRunning(eng)
	attachedOrAttaching := s.v.Spec.NodeID != "" || s.v.Status.CurrentNodeID != ""
	for _, r := range s.replicas {
		if !usable(r) {
			continue
		}
		after := r.DeepCopy()
		switch {
		case running && eng.Status.ReplicaModeMap[r.Name] == v1beta1.ReplicaModeERR:
			s.markFailed(after, "the engine marked it ERR")
		case running && eng.Spec.ReplicaAddressMap[r.Name] != "" && instanceGone(r.Status.CurrentState):
			// The engine had it; its instance is gone (instance manager
			// restarted). Unknown is not gone: the engine judges a replica
			// it cannot reach by marking it ERR.
			s.markFailed(after, fmt.Sprintf("its instance is %s", kit.OrUnknown(string(r.Status.CurrentState))))
		case r.Spec.DesireState == v1beta1.InstanceStateRunning && r.Status.CurrentState == v1beta1.InstanceStateError:
			s.markFailed(after, "its instance failed to start")
		case attachedOrAttaching && r.Spec.NodeID != "" && !s.DS.IsNodeAlive(r.Spec.NodeID) &&
			!(running && eng.Status.ReplicaModeMap[r.Name] == v1beta1.ReplicaModeRW):
			// A running engine that still has the replica RW is the better
			// judge: a node whose manager restarts (its lease runs out) keeps
			// serving data, and a replica that really went with its node is
			// marked ERR by the engine at the next I/O.
			s.markFailed(after, fmt.Sprintf("its node %s is down", r.Spec.NodeID))
		case running && eng.Status.ReplicaModeMap[r.Name] == v1beta1.ReplicaModeRW && r.Spec.HealthyAt == "":
			after.Spec.HealthyAt = s.now.UTC().Format(time.RFC3339)
			delete(after.Annotations, annotationReuseAttempts)
		}
		if _, err := s.updateReplica(r, after); err != nil {
			return err
		}
	}

	want := s.desiredReplicaCount()
	live := s.replicasWhere(usable)
	failed := s.replicasWhere(func(r *v1beta1.Replica) bool { return r.DeletionTimestamp == nil && r.Spec.FailedAt != "" })
	if len(live) == 0 && len(failed) > 0 {
		return nil // faulted: salvage, not replacement (reconcileAttachment)
	}
	if len(s.replicasWhere(rebuilt)) >= want {
		// Enough replicas hold the data: failed ones are no longer needed.
		for _, r := range failed {
			if err := s.deleteReplica(r, "replaced"); err != nil {
				return err
			}
		}
	}
	missing := want - len(live)
	if missing <= 0 {
		local := s.localityNode(eng, running)
		if local != "" && len(failed) == 0 {
			if done, err := s.keepReplicaLocal(live, want, local); done || err != nil {
				return err
			}
		}
		return s.trimExtraReplicas(live, want, local)
	}
	// A volume that never ran holds no data: its replicas are all empty and
	// any can be added. Once a replica has been RW, a new one must be
	// rebuilt by a running engine.
	newVolume := len(s.replicasWhere(func(r *v1beta1.Replica) bool { return r.Spec.HealthyAt != "" })) == 0
	if !newVolume && !running {
		return nil
	}
	if running {
		// A failed replica is given the wait interval to come back before
		// a new one takes its place.
		wait := s.replenishmentWait()
		waiting := 0
		for _, r := range failed {
			failedAt, _ := time.Parse(time.RFC3339, r.Spec.FailedAt)
			if left := failedAt.Add(wait).Sub(s.now); left > 0 {
				if err := s.reuseFailedReplica(r); err != nil {
					return err
				}
				s.Queue.AddAfter(s.key, left)
				waiting++
				continue
			}
			if err := s.deleteReplica(r, "replacing it after the replica-replenishment-wait-interval"); err != nil {
				return err
			}
		}
		missing = max(0, missing-waiting)
	}
	for i := 0; i < missing; i++ {
		if err := s.scheduleReplica(running, ""); err != nil {
			return err
		}
	}
	return nil
}

// instanceGone tells a state in which the instance certainly does not run.
func instanceGone(st v1beta1.InstanceState) bool {
	return st == v1beta1.InstanceStateStopped || st == v1beta1.InstanceStateError || st == ""
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *volumeSync) replenishmentWait() time.Duration {
	secs, err := s.DS.GetSettingInt(types.SettingReplicaReplenishmentWaitInterval)
	if err != nil {
		secs = 600
	}
	return time.Duration(secs) * time.Second
}

// A failed replica is reused at most this many times before it is left to
// be replaced: a disk that keeps failing must not keep the volume rebuilding.
const (
	maxReplicaReuses        = 3
	annotationReuseAttempts = "strata.io/reuse-attempts"
)

// reuseFailedReplica takes a failed replica back, during the replenishment
// wait, once its node, instance manager and disk are back (the disk maybe
// at another path): its data is still there, so the rebuild that follows
// brings over only what it lacks, rather than a new replica copying all.
func (s *volumeSync) reuseFailedReplica(r *v1beta1.Replica) error {
	attempts, _ := strconv.Atoi(r.Annotations[annotationReuseAttempts])
	if attempts >= maxReplicaReuses || r.Spec.NodeID == "" || !s.DS.IsNodeAlive(r.Spec.NodeID) ||
		r.Status.CurrentState != v1beta1.InstanceStateStopped {
		return nil
	}
	if loc, ok := s.DS.LocateDisk(r.Spec.DiskID); !ok || !loc.Ready || loc.Node != r.Spec.NodeID {
		return nil
	}
	down, err := s.instanceManagersDown()
	if err != nil || down[r.Spec.NodeID] != "" {
		return err
	}
	after := r.DeepCopy()
	after.Spec.FailedAt, after.Spec.HealthyAt = "", ""
	if after.Annotations == nil {
		after.Annotations = map[string]string{}
	}
	after.Annotations[annotationReuseAttempts] = strconv.Itoa(attempts + 1)
	if _, err := s.updateReplica(r, after); err != nil {
		return err
	}
	s.Recorder.Eventf(s.v, corev1.EventTypeNormal, EventReasonReplicaReused,
		"reusing failed replica %s on %s (its data is still on disk %s; attempt %d of %d)", r.Name, r.Spec.NodeID,
		r.Spec.DiskID, attempts+1, maxReplicaReuses)
	return nil
}

func (s *volumeSync) markFailed(r *v1beta1.Replica, why string) {
	r.Spec.FailedAt = s.now.UTC().Format(time.RFC3339)
	r.Spec.DesireState = v1beta1.InstanceStateStopped
	s.Logger.WithField("volume", s.v.Name).WithField("replica", r.Name).Warn("Replica failed: " + why)
	s.Recorder.Eventf(s.v, corev1.EventTypeWarning, EventReasonReplicaFailed, "replica %s on %s failed: %s", r.Name, r.Spec.NodeID, why)
}

func (s *volumeSync) deleteReplica(r *v1beta1.Replica, why string) error {
	if err := s.DS.Replicas.Delete(s.ctx, r.Name); err != nil {
		return err
	}
	s.Logger.WithField("volume", s.v.Name).WithField("replica", r.Name).Info("Deleting replica: " + why)
	r = r.DeepCopy()
	now := s.nowMeta()
	r.DeletionTimestamp = &now
	for i := range s.replicas {
		if s.replicas[i].Name == r.Name {
			s.replicas[i] = r
		}
	}
	return nil
}

// trimExtraReplicas deletes live replicas above want: those not yet
// rebuilt first, then the newest; a replica on keepNode (the attached node,
// under data locality) goes last.
func (s *volumeSync) trimExtraReplicas(live []*v1beta1.Replica, want int, keepNode string) error {
	if len(live) <= want {
		return nil
	}
	slices.SortFunc(live, func(a, b *v1beta1.Replica) int {
		if keepNode != "" && (a.Spec.NodeID == keepNode) != (b.Spec.NodeID == keepNode) {
			if a.Spec.NodeID == keepNode {
				return 1
			}
			return -1
		}
		if c := compareStrings(b.Spec.HealthyAt, a.Spec.HealthyAt); a.Spec.HealthyAt == "" || b.Spec.HealthyAt == "" {
			return -c
		}
		return -a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	why := "spec.numberOfReplicas was lowered"
	if keepNode != "" {
		why = fmt.Sprintf("a replica on %s, where the volume is attached, holds the data (dataLocality %s)",
			keepNode, v1beta1.DataLocalityBestEffort)
	}
	for _, r := range live[:len(live)-want] {
		if err := s.deleteReplica(r, why); err != nil {
			return err
		}
		if keepNode != "" {
			s.Recorder.Eventf(s.v, corev1.EventTypeNormal, EventReasonReplicaLocal,
				"replica %s on %s removed: a replica on %s, where the volume is attached, holds the data", r.Name, r.Spec.NodeID, keepNode)
		}
	}
	return nil
}

// localityNode is the node a replica should be kept on: the running
// engine's, for a volume with dataLocality best-effort; else "".
func (s *volumeSync) localityNode(eng *v1beta1.Engine, running bool) string {
	if !running || s.v.Spec.DataLocality != v1beta1.DataLocalityBestEffort {
		return ""
	}
	return eng.Spec.NodeID
}

// keepReplicaLocal adds a replica on node when none of live is there and
// every live replica holds the data, and holds off any trim while the
// local replica rebuilds (done: the caller stops here). When node cannot
// take a replica, best effort: the replicas stay as they are.
func (s *volumeSync) keepReplicaLocal(live []*v1beta1.Replica, want int, node string) (done bool, err error) {
	var local *v1beta1.Replica
	for _, r := range live {
		if r.Spec.NodeID == node {
			local = r
		}
	}
	switch {
	case local != nil:
		return !rebuilt(local), nil // trim only once the local replica holds the data
	case len(live) > want || len(s.replicasWhere(rebuilt)) < len(live):
		return false, nil // something else is under way: trim or rebuild first
	}
	return true, s.scheduleReplica(true, node)
}

// scheduleReplica places and creates one new replica; when nothing fits it
// says why in the Scheduled condition and tries again later.
//
// onlyNode, when set, is a best-effort placement for data locality: when
// that node cannot take the replica nothing is created, and the volume's
// Scheduled condition is not touched (its replicas are all placed).
func (s *volumeSync) scheduleReplica(start bool, onlyNode string) error {
	nodes, err := s.DS.Nodes.ListRO(nil)
	if err != nil {
		return err
	}
	alive, err := s.DS.AliveNodeNames()
	if err != nil {
		return err
	}
	opts := scheduler.Options{AliveNodes: map[string]bool{}}
	for _, n := range alive {
		opts.AliveNodes[n] = true
	}
	opts.SoftAntiAffinity, _ = s.DS.GetSettingBool(types.SettingReplicaSoftAntiAffinity)
	opts.OverProvisioningPercentage, _ = s.DS.GetSettingInt(types.SettingStorageOverProvisioningPercentage)
	opts.MinimalAvailablePercentage, _ = s.DS.GetSettingInt(types.SettingStorageMinimalAvailablePercentage)
	if opts.InstanceManagerDown, err = s.instanceManagersDown(); err != nil {
		return err
	}
	opts.ScheduledBytes = map[string]int64{}
	for _, n := range nodes {
		for _, st := range n.Status.DiskStatus {
			if st == nil || st.DiskUUID == "" {
				continue
			}
			onDisk, err := s.DS.Replicas.ListByIndexRO(datastore.IndexByDisk, st.DiskUUID)
			if err != nil {
				return err
			}
			for _, r := range onDisk {
				opts.ScheduledBytes[st.DiskUUID] += r.Spec.VolumeSize
			}
		}
	}
	// Replicas on their way out do not hold their node or disk.
	placed := s.replicasWhere(func(r *v1beta1.Replica) bool { return r.DeletionTimestamp == nil })
	opts.OnlyNode = onlyNode
	p, err := scheduler.ScheduleReplica(s.v, placed, nodes, opts)
	if onlyNode != "" && scheduler.IsNoPlacement(err) {
		s.Logger.WithError(err).WithField("volume", s.v.Name).Debug("No replica on the attached node for data locality")
		return nil
	}
	if scheduler.IsNoPlacement(err) {
		s.setCondition(v1beta1.VolumeConditionScheduled, false, "ReplicaUnschedulable", err.Error())
		if c := meta.FindStatusCondition(s.vRO.Status.Conditions, v1beta1.VolumeConditionScheduled); c == nil || c.Message != err.Error() {
			s.Recorder.Event(s.v, corev1.EventTypeWarning, EventReasonReplicaUnschedule, err.Error())
		}
		s.Queue.AddAfter(s.key, unschedulableRetry)
		return nil
	}
	if err != nil {
		return err
	}
	suffix := randomSuffix()
	desire := v1beta1.InstanceStateStopped
	if start {
		desire = v1beta1.InstanceStateRunning
	}
	eng := s.primaryEngine()
	r := &v1beta1.Replica{
		ObjectMeta: s.childMeta(s.v.Name + "-r-" + suffix),
		Spec: v1beta1.ReplicaSpec{
			InstanceSpec: v1beta1.InstanceSpec{VolumeName: s.v.Name, VolumeSize: s.v.Status.CurrentSize, NodeID: p.NodeID,
				DesireState: desire, BackingImage: s.v.Spec.BackingImage},
			EngineName: eng.Name, DiskID: p.DiskUUID, DiskName: p.DiskName, DiskPath: p.DiskPath, DataDirectoryName: s.v.Name + "-" + suffix,
		},
	}
	r.Labels[types.LabelNode] = p.NodeID
	r.Labels[types.LabelDisk] = p.DiskUUID
	created, err := s.DS.Replicas.Create(s.ctx, r)
	if err != nil {
		return err
	}
	s.replicas = append(s.replicas, created)
	s.created.add(s.v.Name, created.Name, s.now)
	s.setCondition(v1beta1.VolumeConditionScheduled, true, "ReplicasScheduled", "every replica has a node and disk")
	s.Recorder.Eventf(s.v, corev1.EventTypeNormal, EventReasonReplicaScheduled, "replica %s on %s disk %s", created.Name, p.NodeID, p.DiskName)
	return nil
}

// instanceManagersDown says, per node, why its instance manager cannot take
// a replica now. A node without an InstanceManager CR (a manager started
// without a data plane address) is left to the other rules.
func (s *volumeSync) instanceManagersDown() (map[string]string, error) {
	ims, err := s.DS.InstanceManagers.ListRO(nil)
	if err != nil {
		return nil, err
	}
	down := map[string]string{}
	for _, im := range ims {
		if im.Spec.NodeID == "" || im.Status.CurrentState == v1beta1.InstanceStateRunning {
			continue
		}
		// The InstanceManager's Ready condition has the details; its
		// changing error text is left out so the volumes' conditions (and
		// events) change only when the state does.
		down[im.Spec.NodeID] = fmt.Sprintf("instance manager %s is %s (kubectl -n %s describe im %s)",
			im.Name, kit.OrUnknown(string(im.Status.CurrentState)), im.Namespace, im.Name)
	}
	return down, nil
}

// salvage makes a faulted, fully detached volume usable again: the failed
// replicas that held the data last (they failed together, at the latest
// failure time) are trusted again. The volume then attaches as its
// VolumeAttachment asks.
func (s *volumeSync) salvage() error {
	var cands []*v1beta1.Replica
	for _, r := range s.replicas {
		if r.DeletionTimestamp == nil && r.Spec.FailedAt != "" && r.Spec.HealthyAt != "" && s.DS.IsNodeAlive(r.Spec.NodeID) {
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		s.setCondition(v1beta1.VolumeConditionSalvaged, false, "NoCandidate", "no failed replica that held data is on a live node")
		return nil
	}
	latest := ""
	for _, r := range cands {
		latest = max(latest, r.Spec.FailedAt)
	}
	latestAt, _ := time.Parse(time.RFC3339, latest)
	var chosen []*v1beta1.Replica
	var names []string
	for _, r := range cands {
		if at, _ := time.Parse(time.RFC3339, r.Spec.FailedAt); latestAt.Sub(at) <= salvageWindow {
			chosen = append(chosen, r)
			names = append(names, r.Name)
		}
	}
	// The status (detached, the Salvaged condition) is written before the
	// replicas change: if that write fails nothing was salvaged and the
	// next pass starts over, rather than trusting replicas again while the
	// status still says the volume is on its way out of a node.
	msg := fmt.Sprintf("salvaged replicas %v", names)
	s.setCondition(v1beta1.VolumeConditionSalvaged, true, "Salvaged", msg)
	if err := s.writeStatus(); err != nil {
		return err
	}
	for _, r := range chosen {
		after := r.DeepCopy()
		after.Spec.FailedAt = ""
		if _, err := s.updateReplica(r, after); err != nil {
			return err
		}
	}
	s.Recorder.Event(s.v, corev1.EventTypeWarning, EventReasonVolumeSalvaged, msg)
	return nil
}

// salvageWindow: replicas that failed within this of the last failure are
// taken to hold the same data.
const salvageWindow = time.Minute

func (s *volumeSync) nowMeta() metav1.Time { return metav1.NewTime(s.now) }

// cacheCatchUpDelay is how soon a volume is looked at again while the cache
// lacks a replica this manager created (the watch brings it in milliseconds).
const cacheCatchUpDelay = 100 * time.Millisecond

// createdReplicaExpiry bounds how long a created replica is waited for: one
// the cache never shows (deleted at once by someone) must not block the
// volume for good.
const createdReplicaExpiry = 30 * time.Second

// createdReplicas remembers the replicas this manager created until its
// cache shows them (client-go's "expectations", reduced to what the volume
// controller needs).
type createdReplicas struct {
	mu       sync.Mutex
	byVolume map[string]map[string]time.Time
}

func (c *createdReplicas) add(volume, replica string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byVolume[volume] == nil {
		c.byVolume[volume] = map[string]time.Time{}
	}
	c.byVolume[volume][replica] = now
}

// unseen forgets the created replicas the cache shows (or that expired) and
// tells whether any is still missing from it.
func (c *createdReplicas) unseen(volume string, cached []*v1beta1.Replica, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pending := c.byVolume[volume]
	for _, r := range cached {
		delete(pending, r.Name)
	}
	for name, at := range pending {
		if now.Sub(at) > createdReplicaExpiry {
			delete(pending, name)
		}
	}
	if len(pending) == 0 {
		delete(c.byVolume, volume)
		return false
	}
	return true
}

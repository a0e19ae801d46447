package volume

import (
	"maps"

	corev1 "k8s.io/api/core/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// primaryEngine is the engine serving the volume: the one on the attached
// node, else the one on the node being attached to, else the only one.
func (s *volumeSync) primaryEngine() *v1beta1.Engine {
	for _, node := range []string{s.v.Status.CurrentNodeID, s.v.Spec.NodeID} {
		if node == "" {
			continue
		}
		for _, e := range s.engines {
			if e.DeletionTimestamp == nil && e.Spec.NodeID == node {
				return e
			}
		}
	}
	for _, e := range s.engines {
		if e.DeletionTimestamp == nil {
			return e
		}
	}
	return nil
}

// instanceStopped tells whether an instance is certainly not serving: it is
// stopped or failed, or its node is down (nothing there answers any more).
func (s *volumeSync) instanceStopped(st v1beta1.InstanceStatus, nodeID string) bool {
	switch st.CurrentState {
	case "", v1beta1.InstanceStateStopped, v1beta1.InstanceStateError:
		return true
	case v1beta1.InstanceStateUnknown:
		return nodeID == "" || !s.DS.IsNodeAlive(nodeID)
	}
	return false
}

// reconcileAttachment moves the volume toward spec.nodeID: attach, detach,
// migrate. status.currentNodeID is set only once fully attached and cleared
// only once fully detached.
func (s *volumeSync) reconcileAttachment() error {
	v := s.v
	live := s.replicasWhere(usable)
	if v.Status.State == v1beta1.VolumeStateCreating {
		if len(live) == 0 {
			return nil
		}
		v.Status.State = v1beta1.VolumeStateDetached
	}
	want, cur := v.Spec.NodeID, v.Status.CurrentNodeID
	faulted := len(live) == 0 && len(s.replicas) > 0
	switch {
	case cur != "" && want != "" && want != cur && v.Status.CurrentMigrationNodeID == want:
		return s.confirmMigration()
	case want == "" || faulted || (cur != "" && want != cur) || s.detachUnfinished():
		return s.detach(faulted)
	}
	return s.attach(want)
}

// detachUnfinished tells a detach that must be finished before the volume
// attaches again: it is still recorded on a node whose engine was asked to
// stop (a faulted volume on its way to salvage, say). An engine that died
// while asked to run is recovered by attach instead.
func (s *volumeSync) detachUnfinished() bool {
	if s.v.Status.CurrentNodeID == "" {
		return false
	}
	e := s.primaryEngine()
	return e != nil && e.Spec.DesireState == v1beta1.InstanceStateStopped
}

// detach stops the engines, then the replicas; a faulted volume is salvaged
// and a grown one expanded once nothing runs.
func (s *volumeSync) detach(faulted bool) error {
	v := s.v
	wasUp := v.Status.CurrentNodeID != "" || v.Status.State == v1beta1.VolumeStateAttaching ||
		v.Status.State == v1beta1.VolumeStateAttached || v.Status.State == v1beta1.VolumeStateDetaching
	enginesDown := true
	primary := s.primaryEngine()
	for _, e := range s.engines {
		if e.DeletionTimestamp != nil {
			continue
		}
		if e != primary {
			// A migration engine goes with the detach.
			if err := s.DS.Engines.Delete(s.ctx, e.Name); err != nil {
				return err
			}
			enginesDown = false
			continue
		}
		after := e.DeepCopy()
		after.Spec.DesireState = v1beta1.InstanceStateStopped
		updated, err := s.updateEngine(e, after)
		if err != nil {
			return err
		}
		if !s.instanceStopped(updated.Status.InstanceStatus, updated.Spec.NodeID) {
			enginesDown = false
		}
	}
	if !enginesDown {
		if wasUp {
			v.Status.State = v1beta1.VolumeStateDetaching
		}
		v.Status.FrontendEndpoint = ""
		return nil
	}

	expanding := !faulted && s.specSize() > v.Status.CurrentSize
	replicasDown, expanded := true, expanding
	for _, r := range s.replicas {
		if r.DeletionTimestamp != nil {
			continue
		}
		after := r.DeepCopy()
		after.Spec.DesireState = v1beta1.InstanceStateStopped
		if expanding && usable(r) {
			// Opening a replica at a larger size expands it: no engine needed.
			after.Spec.VolumeSize = s.specSize()
			after.Spec.DesireState = v1beta1.InstanceStateRunning
		}
		updated, err := s.updateReplica(r, after)
		if err != nil {
			return err
		}
		if expanding && usable(r) {
			if updated.Status.CurrentState != v1beta1.InstanceStateRunning {
				expanded = false
			}
			continue
		}
		// A replica with no engine serves nobody; unknown (instance manager
		// unreachable) does not hold the detach.
		if !s.instanceStopped(updated.Status.InstanceStatus, "") && updated.Status.CurrentState != v1beta1.InstanceStateUnknown {
			replicasDown = false
		}
	}
	if !replicasDown {
		if wasUp {
			v.Status.State = v1beta1.VolumeStateDetaching
		}
		return nil
	}
	v.Status.State = v1beta1.VolumeStateDetached
	v.Status.CurrentNodeID = ""
	v.Status.CurrentMigrationNodeID = ""
	v.Status.FrontendEndpoint = ""
	if expanding && expanded {
		old := v.Status.CurrentSize
		v.Status.CurrentSize = s.specSize()
		s.Recorder.Eventf(v, corev1.EventTypeNormal, EventReasonVolumeExpanded, "expanded offline from %d to %d bytes", old, v.Status.CurrentSize)
	}
	if faulted {
		return s.salvage()
	}
	return nil
}

// attach starts the replicas, then the engine on the wanted node with the
// replicas that hold the data; replicas added later are rebuilt by it.
func (s *volumeSync) attach(want string) error {
	v := s.v
	eng := s.primaryEngine()
	size := max(v.Status.CurrentSize, s.specSize())
	anyRebuilt := len(s.replicasWhere(rebuilt)) > 0
	if v.Status.CurrentNodeID == "" {
		v.Status.State = v1beta1.VolumeStateAttaching
	}

	initial, pending := map[string]string{}, 0
	all := map[string]string{}
	for _, r := range s.replicas {
		if r.DeletionTimestamp != nil {
			continue
		}
		after := r.DeepCopy()
		after.Spec.EngineName = eng.Name
		if usable(r) {
			after.Spec.DesireState = v1beta1.InstanceStateRunning
			if !kit.EngineRunning(eng) {
				after.Spec.VolumeSize = size
			}
		} else {
			after.Spec.DesireState = v1beta1.InstanceStateStopped
		}
		updated, err := s.updateReplica(r, after)
		if err != nil {
			return err
		}
		if !usable(updated) {
			continue
		}
		addr := kit.InstanceAddress(&updated.Status.InstanceStatus)
		isRunning := updated.Status.CurrentState == v1beta1.InstanceStateRunning && addr != ""
		if isRunning {
			all[updated.Name] = addr
		} else if prev := eng.Spec.ReplicaAddressMap[updated.Name]; prev != "" {
			// A replica the engine has stays with it until it is marked
			// failed: the engine's ERR mode is the signal that marks it,
			// and dropping the replica first would erase that signal.
			all[updated.Name] = prev
		}
		if rebuilt(updated) || !anyRebuilt {
			if isRunning {
				initial[updated.Name] = addr
			} else {
				pending++
			}
		}
	}

	after := eng.DeepCopy()
	after.Spec.NodeID = want
	after.Spec.DesireState = v1beta1.InstanceStateRunning
	after.Spec.Frontend = v.Spec.Frontend
	after.Spec.DisableFrontend = v.Spec.DisableFrontend
	after.Spec.BackingImage = v.Spec.BackingImage
	after.Spec.SnapshotMaxCount = s.snapshotMaxCount()
	after.Spec.SnapshotMaxSize = v.Spec.SnapshotMaxSize.Value()
	if !kit.EngineRunning(eng) || eng.Spec.NodeID != want {
		if v.Status.State == v1beta1.VolumeStateAttached {
			v.Status.State = v1beta1.VolumeStateAttaching // the engine went away under us
		}
		v.Status.FrontendEndpoint = ""
		if pending > 0 || len(initial) == 0 {
			// Every replica that holds the data starts before the engine, so
			// the engine never starts on a stale subset.
			return nil
		}
		after.Spec.VolumeSize = size
		if eng.Status.CurrentState == v1beta1.InstanceStateStopped || eng.Status.CurrentState == "" {
			after.Spec.ReplicaAddressMap = initial
		}
		_, err := s.updateEngine(eng, after)
		return err
	}

	// The engine runs: hand it every usable running replica (new ones are
	// rebuilt), drop failed ones; a larger size is an online expansion,
	// which the engine controller asks of the instance manager.
	after.Spec.ReplicaAddressMap = all
	after.Spec.VolumeSize = max(after.Spec.VolumeSize, s.specSize())
	eng, err := s.updateEngine(eng, after)
	if err != nil {
		return err
	}
	if v.Spec.Frontend != "" && !v.Spec.DisableFrontend && eng.Status.Endpoint == "" {
		return nil
	}
	v.Status.State = v1beta1.VolumeStateAttached
	v.Status.CurrentNodeID = want
	v.Status.FrontendEndpoint = eng.Status.Endpoint
	if eng.Status.CurrentSize > 0 {
		if old := v.Status.CurrentSize; old != 0 && eng.Status.CurrentSize > old {
			s.Recorder.Eventf(v, corev1.EventTypeNormal, EventReasonVolumeExpanded, "expanded online from %d to %d bytes",
				old, eng.Status.CurrentSize)
		}
		v.Status.CurrentSize = eng.Status.CurrentSize
	}
	return s.reconcileMigration(eng)
}

// snapshotMaxCount is the count limit the volume's engine is given: the
// volume's own, or for a volume stored before the webhook filled it in,
// the snapshot-max-count setting.
func (s *volumeSync) snapshotMaxCount() int32 {
	if n := s.v.Spec.SnapshotMaxCount; n > 0 {
		return n
	}
	n, err := s.DS.GetSettingInt(types.SettingSnapshotMaxCount)
	if err != nil {
		return 0
	}
	return int32(n)
}

// reconcileMigration runs a second engine on spec.migrationNodeID over the
// same replicas while the volume is attached, and removes it on rollback.
func (s *volumeSync) reconcileMigration(primary *v1beta1.Engine) error {
	v := s.v
	target := v.Spec.MigrationNodeID
	var mig *v1beta1.Engine
	for _, e := range s.engines {
		if e == primary || e.DeletionTimestamp != nil {
			continue
		}
		if target != "" && e.Spec.NodeID == target && mig == nil {
			mig = e
			continue
		}
		if err := s.DS.Engines.Delete(s.ctx, e.Name); err != nil {
			return err
		}
	}
	if target == "" || target == v.Status.CurrentNodeID {
		v.Status.CurrentMigrationNodeID = ""
		return nil
	}
	if mig == nil {
		e := s.newEngine(target)
		e.Spec.ReplicaAddressMap = maps.Clone(primary.Spec.ReplicaAddressMap)
		e.Spec.SnapshotMaxCount, e.Spec.SnapshotMaxSize = primary.Spec.SnapshotMaxCount, primary.Spec.SnapshotMaxSize
		created, err := s.DS.Engines.Create(s.ctx, e)
		if err != nil {
			return err
		}
		s.engines = append(s.engines, created)
		return nil
	}
	after := mig.DeepCopy()
	after.Spec.ReplicaAddressMap = maps.Clone(primary.Spec.ReplicaAddressMap)
	after.Spec.VolumeSize = primary.Spec.VolumeSize
	// Both engines set limits on the same replicas: they must agree.
	after.Spec.SnapshotMaxCount, after.Spec.SnapshotMaxSize = primary.Spec.SnapshotMaxCount, primary.Spec.SnapshotMaxSize
	after.Spec.DesireState = v1beta1.InstanceStateRunning
	mig, err := s.updateEngine(mig, after)
	if err != nil {
		return err
	}
	v.Status.CurrentMigrationNodeID = ""
	if kit.EngineRunning(mig) && (v.Spec.Frontend == "" || v.Spec.DisableFrontend || mig.Status.Endpoint != "") {
		v.Status.CurrentMigrationNodeID = target
	}
	return nil
}

// confirmMigration switches the volume to the migration engine once the
// VolumeAttachment controller has moved spec.nodeID to its node.
func (s *volumeSync) confirmMigration() error {
	v := s.v
	var old, mig *v1beta1.Engine
	for _, e := range s.engines {
		switch {
		case e.DeletionTimestamp != nil:
		case e.Spec.NodeID == v.Status.CurrentNodeID:
			old = e
		case e.Spec.NodeID == v.Spec.NodeID:
			mig = e
		}
	}
	if !kit.EngineRunning(mig) {
		// The migration engine died before the switch: detach and attach anew.
		v.Status.CurrentMigrationNodeID = ""
		return nil
	}
	if old != nil {
		if err := s.DS.Engines.Delete(s.ctx, old.Name); err != nil {
			return err
		}
	}
	from := v.Status.CurrentNodeID
	v.Status.CurrentNodeID = mig.Spec.NodeID
	v.Status.CurrentMigrationNodeID = ""
	v.Status.FrontendEndpoint = mig.Status.Endpoint
	s.Recorder.Eventf(v, corev1.EventTypeNormal, EventReasonMigrated, "migrated from %s to %s", from, mig.Spec.NodeID)
	return nil
}

// updateRobustness says how well the data is protected now.
func (s *volumeSync) updateRobustness() {
	v := s.v
	want := s.desiredReplicaCount()
	eng := s.primaryEngine()
	healthy := 0
	if kit.EngineRunning(eng) && v.Status.CurrentNodeID != "" {
		for _, r := range s.replicasWhere(usable) {
			if eng.Status.ReplicaModeMap[r.Name] == v1beta1.ReplicaModeRW {
				healthy++
			}
		}
	} else {
		healthy = len(s.replicasWhere(usable))
	}
	switch {
	case len(s.replicas) == 0:
		v.Status.Robustness = v1beta1.VolumeRobustnessUnknown
	case healthy == 0:
		v.Status.Robustness = v1beta1.VolumeRobustnessFaulted
	case healthy < want:
		v.Status.Robustness = v1beta1.VolumeRobustnessDegraded
	default:
		v.Status.Robustness = v1beta1.VolumeRobustnessHealthy
	}
}

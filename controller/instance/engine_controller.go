package instance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of the engine controller.
const (
	EventReasonEngineStartFailed   = "StartFailed"
	EventReasonEngineReplicaAdd    = "ReplicaAdded"
	EventReasonEngineReplicaRemove = "ReplicaRemoved"
	EventReasonEngineExpanded      = "Expanded"
	EventReasonEngineExpandFailed  = "ExpandFailed"
)

// syncEngine drives one engine's instance toward its spec and writes what
// the instance cache says of it, only when that changed.
func (c *EngineController) syncEngine(ctx context.Context, key string) error {
	eRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Engines, key,
		func(e *v1beta1.Engine) (string, string) { return e.Status.OwnerID, e.Spec.NodeID })
	if err != nil || !ok {
		return err
	}
	e := eRO.DeepCopy()
	e.Status.OwnerID = c.ControllerID

	if e.DeletionTimestamp != nil {
		if err := c.cleanupEngine(ctx, e); err != nil {
			return fmt.Errorf("engine %s: cleaning up: %w", e.Name, err)
		}
		return nil
	}

	var actErr error
	if c.local(e.Spec.NodeID) && c.instances.Starting() {
		return nil // the sync of the new Watch stream enqueues it again
	}
	if c.local(e.Spec.NodeID) {
		inst, found, synced := c.instances.Get(e.Name)
		if synced {
			actErr = c.driveEngine(ctx, e, inst, found)
		}
		observeEngine(e, inst, found, synced, kit.InstanceManagerName(c.ControllerID))
	} else {
		observeUnreachable(&e.Status.InstanceStatus, e.Spec.NodeID)
		if e.Spec.NodeID == "" || !c.DS.IsNodeAlive(e.Spec.NodeID) {
			clearEngineRuntime(&e.Status)
		}
	}
	if actErr != nil {
		actErr = fmt.Errorf("engine %s: driving its instance: %w", e.Name, actErr)
	}
	if !equality.Semantic.DeepEqual(eRO.Status, e.Status) {
		if _, err := c.DS.Engines.UpdateStatus(ctx, e); err != nil {
			return errors.Join(actErr, err)
		}
	}
	return actErr
}

// observeEngine is the engine monitor's write: everything in engine.status
// comes from the last Watch event of the instance.
func observeEngine(e *v1beta1.Engine, inst *engineapi.Instance, found, synced bool, imName string) {
	observeInstance(&e.Status.InstanceStatus, inst, found, synced, imName)
	if !synced {
		return
	}
	if !found {
		clearEngineRuntime(&e.Status)
		return
	}
	e.Status.Endpoint = inst.FrontendEndpoint
	e.Status.CurrentSize = inst.Size
	modes := map[string]v1beta1.ReplicaMode{}
	for r, m := range inst.ReplicaModes {
		modes[r] = v1beta1.ReplicaMode(m)
	}
	e.Status.ReplicaModeMap = nilIfEmpty(modes)
	current := map[string]string{}
	for r := range modes {
		if addr, ok := e.Status.CurrentReplicaAddressMap[r]; ok {
			current[r] = addr
		} else if addr, ok := e.Spec.ReplicaAddressMap[r]; ok {
			current[r] = addr
		}
	}
	e.Status.CurrentReplicaAddressMap = nilIfEmpty(current)
	e.Status.Snapshots = snapshotInfos(inst.Snapshots)
	e.Status.PurgeStatus = nil
	if ps := inst.PurgeStatus; len(ps) > 0 {
		e.Status.PurgeStatus = map[string]*v1beta1.PurgeStatus{}
		for r, p := range ps {
			e.Status.PurgeStatus[r] = &v1beta1.PurgeStatus{IsPurging: p.IsPurging, Progress: p.Progress, State: p.State, Error: p.Error}
		}
	}
	e.Status.RebuildStatus = nil
	if rs := inst.RebuildStatus; len(rs) > 0 {
		e.Status.RebuildStatus = map[string]*v1beta1.RebuildStatus{}
		for r, p := range rs {
			e.Status.RebuildStatus[r] = &v1beta1.RebuildStatus{IsRebuilding: p.IsRebuilding, Progress: p.Progress,
				State: p.State, Error: p.Error, FromReplica: p.FromReplica, CopiedBytes: p.CopiedBytes, KeptBytes: p.KeptBytes,
				CopiedLayers: p.CopiedLayers, KeptLayers: p.KeptLayers}
		}
	}
	e.Status.CloneStatus = nil
	if cs := inst.CloneStatus; cs != nil {
		e.Status.CloneStatus = &v1beta1.EngineCloneStatus{Snapshot: cs.Snapshot, SourceAddress: cs.SourceAddress, Progress: cs.Progress}
	}
}

// clearEngineRuntime forgets what only a running engine knows. The snapshot
// map stays: it is the last word on the chain until the engine runs again.
func clearEngineRuntime(st *v1beta1.EngineStatus) {
	st.Endpoint = ""
	st.ReplicaModeMap = nil
	st.CurrentReplicaAddressMap = nil
	st.PurgeStatus = nil
	st.RebuildStatus = nil
	st.CloneStatus = nil
}

func nilIfEmpty[V any](m map[string]V) map[string]V {
	if len(m) == 0 {
		return nil
	}
	return m
}

// driveEngine makes the calls that bring the instance to the spec: create or
// delete it, add and remove replicas, set its snapshot limits, expand it.
func (c *EngineController) driveEngine(ctx context.Context, e *v1beta1.Engine, inst *engineapi.Instance, found bool) error {
	wantRunning := e.Spec.DesireState == v1beta1.InstanceStateRunning
	if !wantRunning {
		// No running engine holds limits; the next one is created with its spec's.
		e.Status.SnapshotLimits = nil
		if found {
			return c.deleteInstance(ctx, e.Name)
		}
		return nil
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	if !found {
		if len(e.Spec.ReplicaAddressMap) == 0 {
			return nil // the volume controller has not handed over replicas yet
		}
		frontend := string(e.Spec.Frontend)
		if e.Spec.DisableFrontend {
			frontend = ""
		}
		_, err := client.InstanceCreate(ctx, engineapi.InstanceSpec{
			Name: e.Name, Type: engineapi.InstanceTypeEngine, VolumeName: e.Spec.VolumeName,
			Size: e.Spec.VolumeSize, Replicas: e.Spec.ReplicaAddressMap, Frontend: frontend,
			SnapshotMaxCount: e.Spec.SnapshotMaxCount, SnapshotMaxSize: e.Spec.SnapshotMaxSize,
		})
		switch {
		case err == nil:
			// The instance starts with the spec's limits on every replica.
			want := wantSnapshotLimits(e)
			e.Status.SnapshotLimits = &want
		case errors.Is(err, engineapi.ErrAlreadyExists):
			// One runs already, with whatever limits it was given: set them once it runs.
			e.Status.SnapshotLimits = nil
		default:
			c.Recorder.Eventf(e, corev1.EventTypeWarning, EventReasonEngineStartFailed, "starting engine on %s: %v", e.Spec.NodeID, err)
			return fmt.Errorf("starting engine %s: %w", e.Name, err)
		}
		e.Status.CurrentReplicaAddressMap = maps.Clone(e.Spec.ReplicaAddressMap)
		return nil
	}
	if inst.State != engineapi.InstanceStateRunning {
		return nil
	}
	if err := c.reconcileEngineReplicas(ctx, client, e, inst); err != nil {
		return err
	}
	return errors.Join(c.applySnapshotLimits(ctx, client, e), c.expandEngine(ctx, client, e, inst),
		c.purgeFreeable(ctx, client, e))
}

// expandEngine grows a running engine and its replicas to spec.volumeSize
// while it serves (online expansion). A rebuild or a clone in progress
// makes the instance manager answer busy: the next event retries.
func (c *EngineController) expandEngine(ctx context.Context, client engineapi.DataPlane, e *v1beta1.Engine, inst *engineapi.Instance) error {
	if e.Spec.VolumeSize <= inst.Size {
		return nil
	}
	err := client.VolumeExpand(ctx, e.Name, e.Spec.VolumeSize)
	switch {
	case errors.Is(err, engineapi.ErrBusy):
		return fmt.Errorf("expanding engine %s to %d bytes: %w; retrying", e.Name, e.Spec.VolumeSize, err)
	case err != nil:
		c.Recorder.Eventf(e, corev1.EventTypeWarning, EventReasonEngineExpandFailed, "expanding to %d bytes: %v", e.Spec.VolumeSize, err)
		return fmt.Errorf("expanding engine %s to %d bytes: %w", e.Name, e.Spec.VolumeSize, err)
	}
	c.Recorder.Eventf(e, corev1.EventTypeNormal, EventReasonEngineExpanded, "expanded from %d to %d bytes", inst.Size, e.Spec.VolumeSize)
	return nil
}

// reconcileEngineReplicas removes the replicas the spec dropped (or moved to
// another address) and adds the new ones, which the engine rebuilds.
func (c *EngineController) reconcileEngineReplicas(ctx context.Context, client engineapi.DataPlane, e *v1beta1.Engine, inst *engineapi.Instance) error {
	if e.Status.CurrentReplicaAddressMap == nil {
		e.Status.CurrentReplicaAddressMap = map[string]string{}
	}
	modes := inst.ReplicaModes
	for _, r := range slices.Sorted(maps.Keys(modes)) {
		want, keep := e.Spec.ReplicaAddressMap[r]
		if cur, ok := e.Status.CurrentReplicaAddressMap[r]; keep && (!ok || cur == want) {
			continue
		}
		if err := client.ReplicaRemove(ctx, e.Name, r); err != nil && !errors.Is(err, engineapi.ErrNotFound) {
			return fmt.Errorf("removing replica %s from engine %s: %w", r, e.Name, err)
		}
		delete(e.Status.CurrentReplicaAddressMap, r)
		c.Recorder.Eventf(e, corev1.EventTypeNormal, EventReasonEngineReplicaRemove, "removed replica %s", r)
		// The instance's next event tells the new replica set.
		return nil
	}
	for _, r := range slices.Sorted(maps.Keys(e.Spec.ReplicaAddressMap)) {
		if _, ok := modes[r]; ok {
			continue
		}
		addr := e.Spec.ReplicaAddressMap[r]
		err := client.ReplicaAdd(ctx, e.Name, r, addr, true)
		if errors.Is(err, engineapi.ErrBusy) {
			// One rebuild at a time; the end of the running one is an event.
			return nil
		}
		if err != nil && !errors.Is(err, engineapi.ErrAlreadyExists) {
			return fmt.Errorf("adding replica %s at %s to engine %s: %w", r, addr, e.Name, err)
		}
		// The new replica has no limits yet: set them on every replica again.
		e.Status.SnapshotLimits = nil
		e.Status.CurrentReplicaAddressMap[r] = addr
		c.Recorder.Eventf(e, corev1.EventTypeNormal, EventReasonEngineReplicaAdd, "rebuilding replica %s at %s", r, addr)
	}
	return nil
}

func (c *EngineController) cleanupEngine(ctx context.Context, e *v1beta1.Engine) error {
	if !slices.Contains(e.Finalizers, types.FinalizerName) {
		return nil
	}
	// With the instance manager unreachable the engine cannot be stopped
	// now. When its volume is going, the CR goes anyway and an instance
	// left running is stopped once the stream is back (node_orphans.go).
	// Otherwise (a migration's engine, say) a stale engine could still
	// write to the replicas: wait for the instance manager.
	if c.local(e.Spec.NodeID) && !c.instances.Synced() && (c.instances.Starting() || !c.volumeGoing(e.Spec.VolumeName)) {
		return fmt.Errorf("engine %s: no live view of the instance manager to stop it", e.Name)
	}
	if c.local(e.Spec.NodeID) {
		if _, found, _ := c.instances.Get(e.Name); found && c.instances.Synced() {
			if err := c.deleteInstance(ctx, e.Name); err != nil {
				return err
			}
		}
	}
	_, err := c.DS.Engines.RemoveFinalizer(ctx, e, types.FinalizerName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// volumeGoing tells a volume that is deleted or being deleted.
func (c *EngineController) volumeGoing(name string) bool {
	v, err := c.DS.Volumes.GetRO(name)
	return apierrors.IsNotFound(err) || (err == nil && v.DeletionTimestamp != nil)
}

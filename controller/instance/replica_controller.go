package instance

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of the replica controller.
const (
	EventReasonReplicaStartFailed = "StartFailed"
	EventReasonReplicaDataLeft    = "DataLeftOnNode"
	EventReasonReplicaDataDeleted = "DataDeleted"
	EventReasonReplicaDiskMoved   = "DiskMoved"
)

// ReplicaDataPath is where a replica's layers live on its node.
func ReplicaDataPath(r *v1beta1.Replica) string {
	return filepath.Join(r.Spec.DiskPath, "replicas", r.Spec.DataDirectoryName)
}

// syncReplica drives one replica's instance toward its desired state and
// reports what the instance cache says of it.
func (c *ReplicaController) syncReplica(ctx context.Context, key string) error {
	rRO, ok, err := kit.GetResponsible(c.BaseController, c.DS.Replicas, key,
		func(r *v1beta1.Replica) (string, string) { return r.Status.OwnerID, r.Spec.NodeID })
	if err != nil || !ok {
		return err
	}
	r := rRO.DeepCopy()
	r.Status.OwnerID = c.ControllerID

	if r.DeletionTimestamp != nil {
		if err := c.cleanupReplica(ctx, r); err != nil {
			return fmt.Errorf("replica %s: cleaning up: %w", r.Name, err)
		}
		return nil
	}

	if moved, err := c.followMovedDisk(ctx, rRO); moved || err != nil {
		return err // the update brings the replica back
	}
	var actErr error
	if c.local(r.Spec.NodeID) && c.instances.Starting() {
		return nil // the sync of the new Watch stream enqueues it again
	}
	if c.local(r.Spec.NodeID) {
		inst, found, synced := c.instances.Get(r.Name)
		if synced {
			actErr = c.driveReplica(ctx, r, inst, found)
		}
		observeInstance(&r.Status.InstanceStatus, inst, found, synced, kit.InstanceManagerName(c.ControllerID))
	} else {
		observeUnreachable(&r.Status.InstanceStatus, r.Spec.NodeID)
	}
	if actErr != nil {
		actErr = fmt.Errorf("replica %s: driving its instance: %w", r.Name, actErr)
	}
	if !equality.Semantic.DeepEqual(rRO.Status, r.Status) {
		if _, err := c.DS.Replicas.UpdateStatus(ctx, r); err != nil {
			return errors.Join(actErr, err)
		}
	}
	return actErr
}

// driveReplica makes one call toward the desired state; the instance
// manager's Watch event brings the result back through the cache.
func (c *ReplicaController) driveReplica(ctx context.Context, r *v1beta1.Replica, inst *engineapi.Instance, found bool) error {
	wantRunning := r.Spec.DesireState == v1beta1.InstanceStateRunning
	if found {
		setNotWaiting(r) // it runs on its copy, so it waits for nothing
	}
	switch {
	case wantRunning && !found:
		backing, err := c.backingFile(ctx, r)
		if err != nil || (r.Spec.BackingImage != "" && backing == "") {
			return err // waiting for the image's copy on the replica's disk
		}
		client, err := c.client()
		if err != nil {
			return err
		}
		_, err = client.InstanceCreate(ctx, engineapi.InstanceSpec{
			Name: r.Name, Type: engineapi.InstanceTypeReplica, VolumeName: r.Spec.VolumeName,
			Size: r.Spec.VolumeSize, DataDir: ReplicaDataPath(r), BackingFile: backing,
		})
		if err != nil && !errors.Is(err, engineapi.ErrAlreadyExists) {
			c.Recorder.Eventf(r, corev1.EventTypeWarning, EventReasonReplicaStartFailed, "starting replica in %s: %v", ReplicaDataPath(r), err)
			return fmt.Errorf("starting replica %s: %w", r.Name, err)
		}
	case !wantRunning && found:
		return c.deleteInstance(ctx, r.Name)
	case wantRunning && found && inst.State == engineapi.InstanceStateError:
		// A replica that failed to open stays in error for the volume
		// controller to see and replace; nothing to retry here.
	}
	return nil
}

// deleteReplicaData stops the replica's instance and deletes its directory.
func (c *ReplicaController) deleteReplicaData(ctx context.Context, r *v1beta1.Replica) error {
	if _, found, _ := c.instances.Get(r.Name); found {
		if err := c.deleteInstance(ctx, r.Name); err != nil {
			return err
		}
	}
	if r.Spec.DataDirectoryName == "" {
		return nil
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	if err := client.ReplicaDataDelete(ctx, ReplicaDataPath(r)); err != nil {
		return fmt.Errorf("deleting data of replica %s: %w", r.Name, err)
	}
	c.Recorder.Eventf(r, corev1.EventTypeNormal, EventReasonReplicaDataDeleted, "deleted %s on %s", ReplicaDataPath(r), r.Spec.NodeID)
	return nil
}

func (c *instanceController) deleteInstance(ctx context.Context, name string) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	if err := client.InstanceDelete(ctx, name); err != nil && !errors.Is(err, engineapi.ErrNotFound) {
		return fmt.Errorf("stopping instance %s: %w", name, err)
	}
	return nil
}

// cleanupReplica stops the instance and deletes the replica's data before
// the CR goes. A replica whose node is down, or whose node's instance
// manager is unreachable, cannot be cleaned now: its data stays on the disk,
// said loudly, rather than holding the volume's deletion forever. The node's
// manager lists such directories as orphaned in the disk's status and
// deletes them once the instance manager answers again (node_orphans.go).
func (c *ReplicaController) cleanupReplica(ctx context.Context, r *v1beta1.Replica) error {
	if !slices.Contains(r.Finalizers, types.FinalizerName) {
		return nil
	}
	switch {
	case c.local(r.Spec.NodeID) && c.instances.Synced():
		if err := c.deleteReplicaData(ctx, r); err != nil {
			return err
		}
	case c.local(r.Spec.NodeID) && c.instances.Starting():
		return fmt.Errorf("replica %s: no live view of the instance manager yet", r.Name)
	case r.Spec.NodeID != "" && r.Spec.DataDirectoryName != "":
		why := "node " + r.Spec.NodeID + " is down"
		if c.local(r.Spec.NodeID) {
			why = "the instance manager of node " + r.Spec.NodeID + " is unreachable"
		}
		msg := fmt.Sprintf("%s: data directory %s is left there, to be deleted once it is back", why, ReplicaDataPath(r))
		c.Logger.WithField("replica", r.Name).Warn(msg)
		c.Recorder.Event(r, corev1.EventTypeWarning, EventReasonReplicaDataLeft, msg)
	}
	_, err := c.DS.Replicas.RemoveFinalizer(ctx, r, types.FinalizerName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// followMovedDisk points the replica at its disk's new path when the disk
// (same UUID) was remounted elsewhere on the node and added there: its data
// is on that disk, so the replica is reused from the new path.
func (c *ReplicaController) followMovedDisk(ctx context.Context, rRO *v1beta1.Replica) (bool, error) {
	loc, ok := c.DS.LocateDisk(rRO.Spec.DiskID)
	if !ok || !loc.Ready || loc.Node != rRO.Spec.NodeID || (loc.Path == rRO.Spec.DiskPath && loc.Name == rRO.Spec.DiskName) {
		return false, nil
	}
	r := rRO.DeepCopy()
	r.Spec.DiskPath, r.Spec.DiskName = loc.Path, loc.Name
	if _, err := c.DS.Replicas.Update(ctx, r); err != nil {
		return false, err
	}
	c.Recorder.Eventf(r, corev1.EventTypeNormal, EventReasonReplicaDiskMoved, "disk %s is now %s at %s (was %s at %s)",
		r.Spec.DiskID, loc.Name, loc.Path, rRO.Spec.DiskName, rRO.Spec.DiskPath)
	return true, nil
}

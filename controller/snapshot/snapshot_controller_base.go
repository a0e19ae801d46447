package snapshot

import (
	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// SnapshotController keeps Snapshot CRs and the engines' snapshot chains in
// step: it takes the snapshots users ask for, removes and purges the ones
// they delete, mirrors the chain into each CR's status, and gives every
// snapshot in a chain a CR. Status comes from engine.status.snapshots only;
// gRPC is used to act, never to read.
type SnapshotController struct {
	*kit.BaseController
	// engines queues Engine keys: the engine-monitor half of the
	// controller (CRs for chain snapshots that have none).
	engines workqueue.TypedRateLimitingInterface[string]
}

// NewSnapshotController wires the snapshot controller of node controllerID.
func NewSnapshotController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector) (*SnapshotController, error) {
	c := &SnapshotController{BaseController: kit.NewBaseController("strata-snapshot", controllerID, logger, ds, recorder)}
	c.DataPlane = dataPlane
	c.Sync = c.syncSnapshot
	c.engines = c.AddQueue("strata-snapshot-engines", c.syncEngineSnapshots)
	if _, err := ds.Snapshots.Informer().AddEventHandler(c.EnqueueOnChange()); err != nil {
		return nil, err
	}
	if _, err := ds.Engines.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    kit.OnAdd(func(e *v1beta1.Engine) { c.engines.Add(e.Namespace + "/" + e.Name) }),
		UpdateFunc: kit.OnUpdate(c.enqueueEngineChange),
	}); err != nil {
		return nil, err
	}
	// Snapshots waiting for their volume to attach (or to be deleted with
	// it) look again when its state changes.
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Volume) {
			if attachmentOrOwnerChanged(o, n) {
				c.enqueueVolumeSnapshots(n.Name)
			}
			// A clone done with its source's snapshot lets a delete go on.
			if kit.VolumeSettled(o) != kit.VolumeSettled(n) {
				c.enqueueSourceSnapshot(n)
			}
		}),
		DeleteFunc: kit.OnDelete(c.enqueueSourceSnapshot),
	}); err != nil {
		return nil, err
	}
	// So does a backup that finished (or went) with its snapshot.
	if _, err := ds.Backups.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Backup) {
			if kit.BackupFinished(o) != kit.BackupFinished(n) {
				c.enqueueBackupSnapshot(n)
			}
		}),
		DeleteFunc: kit.OnDelete(c.enqueueBackupSnapshot),
	}); err != nil {
		return nil, err
	}
	return c, c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(ds.Snapshots.Informer()))
}

// enqueueEngineChange enqueues only what an engine update concerns: the
// snapshots whose entry in the chain changed; every snapshot of the volume
// when the engine's state, node or purge status changed (what they wait
// for); and the engine itself when new snapshots appeared (they may need a
// CR). A head growing or a status write that touched nothing else
// enqueues nothing.
func (c *SnapshotController) enqueueEngineChange(old, cur *v1beta1.Engine) {
	changed, all, appeared := engineSnapshotDiff(old, cur)
	if all {
		c.enqueueVolumeSnapshots(cur.Spec.VolumeName)
	} else {
		for _, name := range changed {
			c.Queue.Add(cur.Namespace + "/" + name)
		}
	}
	if appeared {
		c.engines.Add(cur.Namespace + "/" + cur.Name)
	}
}

// attachmentOrOwnerChanged: what snapshots (and groups) of a volume wait
// for changed: its state, node or owner, or it began to be deleted.
func attachmentOrOwnerChanged(o, n *v1beta1.Volume) bool {
	return o.Status.State != n.Status.State || o.Status.CurrentNodeID != n.Status.CurrentNodeID ||
		o.Status.OwnerID != n.Status.OwnerID || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
}

func (c *SnapshotController) enqueueVolumeSnapshots(volume string) {
	snaps, err := c.DS.Snapshots.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		c.Logger.WithError(err).Warn("Cannot list a volume's snapshots")
		return
	}
	for _, s := range snaps {
		c.Enqueue(s)
	}
}

// engineSnapshotDiff compares two versions of an engine for the snapshot
// controller. Pure, so the enqueue filter is table-tested.
func engineSnapshotDiff(old, cur *v1beta1.Engine) (changed []string, all, appeared bool) {
	all = old.Status.CurrentState != cur.Status.CurrentState || old.Spec.NodeID != cur.Spec.NodeID ||
		!equality.Semantic.DeepEqual(old.Status.PurgeStatus, cur.Status.PurgeStatus)
	for name, n := range cur.Status.Snapshots {
		if name == types.VolumeHeadName {
			continue
		}
		o, ok := old.Status.Snapshots[name]
		if !ok {
			appeared = true
		}
		if !ok || !equality.Semantic.DeepEqual(o, n) {
			changed = append(changed, name)
		}
	}
	for name := range old.Status.Snapshots {
		if _, ok := cur.Status.Snapshots[name]; !ok && name != types.VolumeHeadName {
			changed = append(changed, name)
		}
	}
	return changed, all, appeared
}

func (c *SnapshotController) enqueueBackupSnapshot(b *v1beta1.Backup) {
	c.EnqueueName(b.Spec.SnapshotName)
	c.EnqueueName(b.Status.SnapshotName)
}

func (c *SnapshotController) enqueueSourceSnapshot(v *v1beta1.Volume) {
	if src, ok := types.ParseDataSource(v.Spec.DataSource); ok {
		c.EnqueueName(src.Snapshot)
	}
	if cs := v.Status.CloneStatus; cs != nil {
		c.EnqueueName(cs.Snapshot)
	}
}

package backup

import (
	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// VolumeRestoreController fills a new volume from its spec.fromBackup
// (issue 15): it attaches the volume without a frontend through a
// volume-restore-controller ticket (the seed's priority 2000), has the
// instance manager of the engine's node fetch the backup into it
// (BackupRestore, every chunk checked against its hash), follows the job
// through this node's instance cache into status.restoreStatus, and
// releases the ticket once the restore completed. Until then the AD
// controller attaches the volume for no other ticket, so nothing reads a
// half-restored volume.
type VolumeRestoreController struct {
	*kit.BaseController
	// instances is this node's instance cache, where a restore job's
	// progress and end show. Nil on a node without an instance manager,
	// which then restores nothing.
	instances *kit.InstanceCache
	// retries are the failed restore jobs of volumes this manager fills.
	retries *kit.JobRetries
}

// NewVolumeRestoreController wires the restore controller of node controllerID.
func NewVolumeRestoreController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector, instances *kit.InstanceCache) (*VolumeRestoreController, error) {
	c := &VolumeRestoreController{
		BaseController: kit.NewBaseController("strata-volume-restore", controllerID, logger, ds, recorder),
		instances:      instances, retries: kit.NewJobRetries(),
	}
	c.DataPlane = dataPlane
	c.Sync = c.syncRestore
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(v *v1beta1.Volume) {
			if v.Spec.FromBackup != "" {
				c.Enqueue(v)
			}
		}),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Volume) {
			if restoreChangeMatters(o, n) {
				c.Enqueue(n)
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.Engines.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Engine) {
			if o.Status.CurrentState != n.Status.CurrentState || o.Status.Endpoint != n.Status.Endpoint {
				c.enqueueRestoring(n.Spec.VolumeName)
			}
		}),
	}); err != nil {
		return nil, err
	}
	// A target created, fixed or made available again lets waiting restores go on.
	if _, err := ds.BackupTargets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(*v1beta1.BackupTarget) { c.enqueueAllRestoring() }),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.BackupTarget) {
			if o.Status.Available != n.Status.Available || o.Generation != n.Generation {
				c.enqueueAllRestoring()
			}
		}),
	}); err != nil {
		return nil, err
	}
	if instances != nil {
		// An engine's instance carries its restore job's status.
		instances.OnChange(func(name string) {
			if e, err := ds.Engines.GetRO(name); err == nil {
				c.enqueueRestoring(e.Spec.VolumeName)
			}
		})
		instances.OnSynced(c.enqueueAllRestoring)
	}
	return c, c.RequeueOnNodeReadyChange(c.enqueueAllRestoring)
}

// restoreChangeMatters: a volume to restore whose attachment, ownership or
// restore moved, or that is going. A restored volume's churn enqueues
// nothing once its restore status stopped changing.
func restoreChangeMatters(o, n *v1beta1.Volume) bool {
	if n.Spec.FromBackup == "" {
		return false
	}
	if !equality.Semantic.DeepEqual(o.Status.RestoreStatus, n.Status.RestoreStatus) ||
		(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
		return true
	}
	return kit.RestoreIncomplete(n) && (o.Status.State != n.Status.State || o.Status.CurrentNodeID != n.Status.CurrentNodeID ||
		o.Spec.NodeID != n.Spec.NodeID || o.Status.OwnerID != n.Status.OwnerID)
}

// enqueueRestoring enqueues a volume still to be restored.
func (c *VolumeRestoreController) enqueueRestoring(volume string) {
	if v, err := c.DS.Volumes.GetRO(volume); err == nil && kit.RestoreIncomplete(v) {
		c.Enqueue(v)
	}
}

// enqueueAllRestoring enqueues every volume still to be restored.
func (c *VolumeRestoreController) enqueueAllRestoring() { c.EnqueueVolumesWhere(kit.RestoreIncomplete) }

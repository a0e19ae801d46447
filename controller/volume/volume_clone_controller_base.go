package volume

import (
	"context"
	"sync"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/equality"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// VolumeCloneController fills a new volume from its spec.dataSource (a
// snapshot of another volume, or a fresh snapshot of a whole volume): it
// attaches both volumes through volume-clone-controller tickets owned by the
// new volume, has the target's instance manager copy the snapshot
// (SnapshotClone), mirrors the copy's progress into status.cloneStatus and
// releases the tickets when done. Until the clone is completed the AD
// controller attaches the volume for no other ticket.
type VolumeCloneController struct {
	*kit.BaseController

	// snapshots queues the keys of snapshots taken for clones whose target
	// volume went away before the clone controller saw it go.
	snapshots workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// copies are the SnapshotClone calls this manager runs, by target UID;
	// results holds how each ended until the next sync reads it.
	copies  map[k8stypes.UID]context.CancelFunc
	results map[k8stypes.UID]copyOutcome
	// runCtx is the context the copies run under (the controller's Run).
	runCtx context.Context
}

// NewVolumeCloneController wires the clone controller of node controllerID.
func NewVolumeCloneController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector) (*VolumeCloneController, error) {
	c := &VolumeCloneController{
		BaseController: kit.NewBaseController("strata-volume-clone", controllerID, logger, ds, recorder),
		copies:         map[k8stypes.UID]context.CancelFunc{},
		results:        map[k8stypes.UID]copyOutcome{},
		runCtx:         context.Background(),
	}
	c.DataPlane = dataPlane
	c.Sync = c.syncClone
	c.snapshots = c.AddQueue("strata-volume-clone-snapshots", c.syncCloneSnapshot)
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(v *v1beta1.Volume) {
			if v.Spec.DataSource != "" {
				c.Enqueue(v)
			}
		}),
		UpdateFunc: kit.OnUpdate(c.enqueueVolumeChange),
		DeleteFunc: kit.OnDelete(func(v *v1beta1.Volume) {
			c.enqueueClonesOf(v.Name)
			if src, ok := types.ParseDataSource(v.Spec.DataSource); ok && src.Snapshot == "" {
				c.snapshots.Add(v.Namespace + "/" + cloneSnapshotName(v.Name))
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.Engines.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Engine) {
			if engineChangeMattersForClone(o, n) {
				c.enqueueVolumeAndClones(n.Spec.VolumeName)
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.Snapshots.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(s *v1beta1.Snapshot) { c.enqueueClonesOf(s.Spec.Volume) }),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Snapshot) {
			if o.Status.ReadyToUse != n.Status.ReadyToUse || o.Status.Error != n.Status.Error ||
				(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
				c.enqueueClonesOf(n.Spec.Volume)
			}
		}),
		DeleteFunc: kit.OnDelete(func(s *v1beta1.Snapshot) { c.enqueueClonesOf(s.Spec.Volume) }),
	}); err != nil {
		return nil, err
	}
	return c, c.RequeueOnNodeReadyChange(c.enqueueClones)
}

// Run keeps ctx for the copies, then runs the workers.
func (c *VolumeCloneController) Run(ctx context.Context, workers int) {
	c.mu.Lock()
	c.runCtx = ctx
	c.mu.Unlock()
	c.BaseController.Run(ctx, workers)
}

// enqueueVolumeChange enqueues a target whose own state moved, and the
// targets cloning from a source whose attachment moved. Size and condition
// churn enqueue nothing.
func (c *VolumeCloneController) enqueueVolumeChange(o, n *v1beta1.Volume) {
	attachmentMoved := o.Status.State != n.Status.State || o.Status.CurrentNodeID != n.Status.CurrentNodeID ||
		o.Spec.NodeID != n.Spec.NodeID || o.Status.OwnerID != n.Status.OwnerID ||
		(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	if n.Spec.DataSource != "" && (attachmentMoved || !equality.Semantic.DeepEqual(o.Status.CloneStatus, n.Status.CloneStatus)) {
		c.Enqueue(n)
	}
	if attachmentMoved {
		c.enqueueClonesOf(n.Name)
	}
}

// engineChangeMattersForClone: the copy can start (the engine runs, its
// frontend is off, its replicas are known) or moved on (progress).
func engineChangeMattersForClone(o, n *v1beta1.Engine) bool {
	return o.Status.CurrentState != n.Status.CurrentState || o.Status.Endpoint != n.Status.Endpoint ||
		!equality.Semantic.DeepEqual(o.Status.ReplicaModeMap, n.Status.ReplicaModeMap) ||
		!equality.Semantic.DeepEqual(o.Status.CloneStatus, n.Status.CloneStatus)
}

// enqueueVolumeAndClones enqueues the volume when it is a clone target, and
// the clones of it.
func (c *VolumeCloneController) enqueueVolumeAndClones(volume string) {
	if v, err := c.DS.Volumes.GetRO(volume); err == nil && v.Spec.DataSource != "" {
		c.Enqueue(v)
	}
	c.enqueueClonesOf(volume)
}

// enqueueClonesOf enqueues the volumes filled from source (by-clone-source index).
func (c *VolumeCloneController) enqueueClonesOf(source string) {
	targets, err := c.DS.Volumes.ListByIndexRO(datastore.IndexByCloneSource, source)
	if err != nil {
		c.Logger.WithError(err).WithField("volume", source).Warn("Cannot list the clones of a volume")
		return
	}
	for _, t := range targets {
		c.Enqueue(t)
	}
}

// enqueueClones enqueues every volume with a data source (node ownership changed).
func (c *VolumeCloneController) enqueueClones() {
	c.EnqueueVolumesWhere(func(v *v1beta1.Volume) bool { return v.Spec.DataSource != "" })
}

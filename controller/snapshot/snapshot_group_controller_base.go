package snapshot

import (
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// SnapshotGroupController takes group snapshots (SnapshotGroup): once every
// member volume's engine runs (it asks detached ones to attach), it cuts
// them all at one crash-consistent point (engineapi.GroupCut), then gives
// each member snapshot a Snapshot CR labelled with the group and owned by
// it. The cut's manager is the first volume's. A cut is recorded as begun
// before it starts, so one whose manager died is rolled back and retaken.
type SnapshotGroupController struct {
	*kit.BaseController
}

// NewSnapshotGroupController wires the group snapshot controller of node
// controllerID.
func NewSnapshotGroupController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector) (*SnapshotGroupController, error) {
	c := &SnapshotGroupController{BaseController: kit.NewBaseController("strata-snapshot-group", controllerID, logger, ds, recorder)}
	c.DataPlane = dataPlane
	c.Sync = c.syncGroup
	if _, err := ds.SnapshotGroups.Informer().AddEventHandler(c.EnqueueOnChange()); err != nil {
		return nil, err
	}
	// A pending group waits for its volumes: their attachment and owner
	// changes (and a volume going away) look at the groups naming them.
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Volume) {
			if attachmentOrOwnerChanged(o, n) {
				c.enqueueVolumeGroups(n.Name)
			}
		}),
		DeleteFunc: kit.OnDelete(func(v *v1beta1.Volume) { c.enqueueVolumeGroups(v.Name) }),
	}); err != nil {
		return nil, err
	}
	// So does one whose engine starts or stops running.
	if _, err := ds.Engines.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Engine) {
			if kit.EngineRunning(o) != kit.EngineRunning(n) {
				c.enqueueVolumeGroups(n.Spec.VolumeName)
			}
		}),
	}); err != nil {
		return nil, err
	}
	// A group just cut, once the engine monitor made its members' CRs.
	if _, err := ds.Snapshots.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(s *v1beta1.Snapshot) { c.EnqueueName(s.Spec.Labels[types.LabelSnapshotGroup]) }),
	}); err != nil {
		return nil, err
	}
	return c, c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(ds.SnapshotGroups.Informer()))
}

func (c *SnapshotGroupController) enqueueVolumeGroups(volume string) {
	groups, err := c.DS.SnapshotGroups.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		c.Logger.WithError(err).Warn("Cannot list a volume's group snapshots")
		return
	}
	for _, g := range groups {
		c.Enqueue(g)
	}
}

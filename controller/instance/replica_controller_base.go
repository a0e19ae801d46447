package instance

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

// ReplicaController starts and stops replica instances in this node's
// instance manager as replica.spec.desireState says, reports their state
// from the instance cache, and deletes a replica's data with its CR.
type ReplicaController struct {
	*instanceController
}

// NewReplicaController wires the replica controller of node controllerID,
// whose instance manager is at imAddress (empty when the node runs none).
func NewReplicaController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID, imAddress string, dataPlane engineapi.Connector, instances *kit.InstanceCache) (*ReplicaController, error) {
	c := &ReplicaController{instanceController: &instanceController{
		BaseController: kit.NewBaseController("strata-replica", controllerID, logger, ds, recorder),
		imAddress:      imAddress, instances: instances,
	}}
	c.DataPlane = dataPlane
	c.Sync = c.syncReplica
	// A replica waiting for its backing image's copy starts once the copy
	// on its disk is ready.
	if _, err := ds.BackingImages.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(c.enqueueWaitingOn),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.BackingImage) {
			if o.Status.UUID != n.Status.UUID || !equality.Semantic.DeepEqual(o.Status.DiskFileStatusMap, n.Status.DiskFileStatusMap) ||
				!equality.Semantic.DeepEqual(o.Spec.DiskFileSpecMap, n.Spec.DiskFileSpecMap) {
				c.enqueueWaitingOn(n)
			}
		}),
		DeleteFunc: kit.OnDelete(c.enqueueWaitingOn),
	}); err != nil {
		return nil, err
	}
	// A disk of this node found at another path: its replicas follow it.
	if _, err := ds.Nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Node) {
			if n.Name == controllerID && !equality.Semantic.DeepEqual(datastore.NodeDisks(o), datastore.NodeDisks(n)) {
				c.enqueueReplicasOfNode(n.Name)
			}
		}),
	}); err != nil {
		return nil, err
	}
	return c, c.wireInstanceEvents(ds.Replicas.Informer())
}

func (c *ReplicaController) enqueueReplicasOfNode(node string) {
	reps, err := c.DS.Replicas.ListByIndexRO(datastore.IndexByNode, node)
	if err != nil {
		return
	}
	for _, r := range reps {
		c.Enqueue(r)
	}
}

// enqueueWaitingOn enqueues this node's replicas of the image that are not
// running yet.
func (c *ReplicaController) enqueueWaitingOn(bi *v1beta1.BackingImage) {
	reps, err := c.DS.Replicas.ListByIndexRO(datastore.IndexByBackingImage, bi.Name)
	if err != nil {
		return
	}
	for _, r := range reps {
		if r.Spec.NodeID == c.ControllerID && r.Status.CurrentState != v1beta1.InstanceStateRunning {
			c.Enqueue(r)
		}
	}
}

package instance

import (
	"k8s.io/client-go/tools/cache"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/engineapi"
)

// instanceController is what the engine and replica controllers share: the
// instance manager of this node (its address, the pooled client and the
// cache its Watch stream feeds) and the wiring that enqueues an object when
// its instance changes.
type instanceController struct {
	*kit.BaseController
	imAddress string
	instances *kit.InstanceCache
}

// wireInstanceEvents enqueues the object named like a changed instance (an
// Engine or Replica CR has its instance's name), and every object of the
// kind when a node's Ready condition flips, which may move ownership.
func (c *instanceController) wireInstanceEvents(informer cache.SharedIndexInformer) error {
	if c.instances != nil {
		c.instances.OnChange(func(name string) { c.Queue.Add(c.DS.Namespace + "/" + name) })
		// Once the view is complete again, every object on this node gets a
		// look, including those whose instance does not exist yet.
		c.instances.OnSynced(func() { c.EnqueueByNode(informer, c.ControllerID) })
	}
	// The same when any node's instance manager changes state as its CR
	// says: objects there owned by this manager (their node's manager is
	// down) are judged again.
	if err := c.OnInstanceManagerStateChange(func(node string) { c.EnqueueByNode(informer, node) }); err != nil {
		return err
	}
	if _, err := informer.AddEventHandler(c.EnqueueOnChange()); err != nil {
		return err
	}
	return c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(informer))
}

// local tells whether an instance on nodeID runs in this manager's instance
// manager, so this manager can act on it and knows its state.
func (c *instanceController) local(nodeID string) bool {
	return nodeID != "" && nodeID == c.ControllerID && c.instances != nil
}

// client is this node's instance manager.
func (c *instanceController) client() (engineapi.DataPlane, error) {
	return c.DataPlane.DataPlane(c.imAddress)
}

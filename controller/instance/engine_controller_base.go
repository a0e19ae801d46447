package instance

import (
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
)

// EngineController starts and stops engine instances in this node's instance
// manager, keeps their replica sets and frontends as the Engine CR says, and
// is the engine monitor: engine.status is written from the instance cache,
// which the instance manager's Watch stream feeds.
type EngineController struct {
	*instanceController
}

// NewEngineController wires the engine controller of node controllerID,
// whose instance manager is at imAddress (empty when the node runs none).
func NewEngineController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID, imAddress string, dataPlane engineapi.Connector, instances *kit.InstanceCache) (*EngineController, error) {
	c := &EngineController{instanceController: &instanceController{
		BaseController: kit.NewBaseController("strata-engine", controllerID, logger, ds, recorder),
		imAddress:      imAddress, instances: instances,
	}}
	c.DataPlane = dataPlane
	c.Sync = c.syncEngine
	return c, c.wireInstanceEvents(ds.Engines.Informer())
}

package controller

import (
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
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
	controllerID, imAddress string, dataPlane engineapi.Connector, instances *InstanceCache) (*ReplicaController, error) {
	c := &ReplicaController{instanceController: &instanceController{
		baseController: newBaseController("strata-replica", controllerID, logger, ds, recorder),
		imAddress:      imAddress, instances: instances,
	}}
	c.dataPlane = dataPlane
	c.sync = c.syncReplica
	return c, c.wireInstanceEvents(ds.Replicas.Informer())
}

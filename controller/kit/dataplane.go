package kit

import (
	"fmt"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// VolumeEngine is the engine that serves a volume's data: the one on the
// node the volume is attached to, else (detached, or a migration's second
// engine) the first by name. Nil when the volume has none.
func (c *BaseController) VolumeEngine(vol *v1beta1.Volume) (*v1beta1.Engine, error) {
	engines, err := c.DS.Engines.ListByIndexRO(datastore.IndexByVolume, vol.Name)
	if err != nil {
		return nil, fmt.Errorf("listing the engines of volume %s: %w", vol.Name, err)
	}
	var fallback *v1beta1.Engine
	for _, e := range engines {
		if e.DeletionTimestamp != nil {
			continue
		}
		if vol.Status.CurrentNodeID != "" && e.Spec.NodeID == vol.Status.CurrentNodeID {
			return e, nil
		}
		if fallback == nil || e.Name < fallback.Name {
			fallback = e
		}
	}
	return fallback, nil
}

// EngineDataPlane reaches the instance manager that runs an engine, at the
// endpoint its node's InstanceManager reports.
func (c *BaseController) EngineDataPlane(e *v1beta1.Engine) (engineapi.DataPlane, error) {
	im, err := c.DS.InstanceManagers.GetRO(InstanceManagerName(e.Spec.NodeID))
	if err != nil {
		return nil, fmt.Errorf("instance manager of node %s: %w", e.Spec.NodeID, err)
	}
	if im.Status.Endpoint == "" {
		return nil, fmt.Errorf("instance manager of node %s has no endpoint yet", e.Spec.NodeID)
	}
	if c.DataPlane == nil {
		return nil, fmt.Errorf("controller %s has no data plane access", c.name)
	}
	return c.DataPlane.DataPlane(im.Status.Endpoint)
}

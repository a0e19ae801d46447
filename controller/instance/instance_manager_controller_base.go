package instance

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// imConnection is what the Watch stream tells about this node's instance
// manager: whether a stream is open, and the last error.
type imConnection struct {
	connected bool
	err       string
}

// InstanceManagerController keeps this node's InstanceManager CR: its
// endpoint and whether the instance manager answers. It learns the latter
// from a Watch stream it holds open, so the sync makes no gRPC call and an
// idle instance manager costs no polling.
type InstanceManagerController struct {
	*kit.BaseController
	address   string
	dataPlane engineapi.Connector
	cache     *kit.InstanceCache

	mu   sync.Mutex
	conn imConnection
}

// NewInstanceManagerController wires the controller for the instance manager
// of node controllerID, reachable at address. The events of its Watch stream
// feed instances, which the engine and replica controllers read.
func NewInstanceManagerController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID, address string, dataPlane engineapi.Connector, instances *kit.InstanceCache) (*InstanceManagerController, error) {
	c := &InstanceManagerController{
		BaseController: kit.NewBaseController("strata-instance-manager", controllerID, logger, ds, recorder),
		address:        address, dataPlane: dataPlane, cache: instances,
	}
	c.Sync = c.syncInstanceManager
	_, err := ds.InstanceManagers.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: kit.FilterFor(func(im *v1beta1.InstanceManager) bool {
			return im.Name == kit.InstanceManagerName(controllerID)
		}),
		Handler: c.EnqueueOnChange(),
	})
	return c, err
}

func (c *InstanceManagerController) key() string {
	return c.DS.Namespace + "/" + kit.InstanceManagerName(c.ControllerID)
}

// Run holds the Watch stream open and runs the workers until ctx ends.
func (c *InstanceManagerController) Run(ctx context.Context, workers int) {
	go c.watchInstanceManager(ctx)
	c.Queue.Add(c.key())
	c.BaseController.Run(ctx, workers)
}

// watchInstanceManager keeps a Watch stream to the instance manager open,
// reconnecting with backoff, feeds its events to the instance cache (the
// engine monitor), and enqueues the CR whenever the connection's state changes.
func (c *InstanceManagerController) watchInstanceManager(ctx context.Context) {
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 5 * time.Second}
	}
	backoff := newBackoff()
	for ctx.Err() == nil {
		err := c.watchOnce(ctx)
		if c.connection().connected {
			backoff = newBackoff() // a stream that worked retries at once-ish
		}
		if ctx.Err() != nil {
			return
		}
		c.cache.StreamLost()
		c.setConnection(imConnection{err: err.Error()})
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Step()):
		}
	}
}

func (c *InstanceManagerController) watchOnce(ctx context.Context) error {
	dp, err := c.dataPlane.DataPlane(c.address)
	if err != nil {
		return err
	}
	next, err := dp.Watch(ctx)
	if err != nil {
		return err
	}
	c.cache.StreamOpened()
	for {
		ev, err := next()
		if err != nil {
			return err
		}
		c.cache.Apply(ev)
		// The first event (the current state) proves the stream is live.
		c.setConnection(imConnection{connected: true})
	}
}

func (c *InstanceManagerController) setConnection(conn imConnection) {
	c.mu.Lock()
	changed := c.conn != conn
	c.conn = conn
	c.mu.Unlock()
	if changed {
		c.Queue.Add(c.key())
	}
}

func (c *InstanceManagerController) connection() imConnection {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

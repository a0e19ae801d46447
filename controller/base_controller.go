// Package controller holds Strata's controllers. Each has a *_controller_base.go
// (constructor, informer handlers that decide whom to enqueue, Run) and a
// *_controller.go (the sync: one function per decision).
package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-storage/strata/datastore"
)

// maxRetries is how often a failing key is retried with backoff before it is
// dropped; a later change to the object enqueues it again.
const maxRetries = 15

// baseController is the plumbing every controller shares: the rate-limited
// queue and the sample-controller worker loop around a sync function.
type baseController struct {
	name         string
	controllerID string // this manager's node name
	logger       logrus.FieldLogger
	ds           *datastore.DataStore
	recorder     record.EventRecorder
	queue        workqueue.TypedRateLimitingInterface[string]
	sync         func(ctx context.Context, key string) error
}

func newBaseController(name, controllerID string, logger logrus.FieldLogger, ds *datastore.DataStore,
	recorder record.EventRecorder) *baseController {
	return &baseController{
		name:         name,
		controllerID: controllerID,
		logger:       logger.WithField("controller", name),
		ds:           ds,
		recorder:     recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name}),
	}
}

// Run starts workers and blocks until ctx ends, then drains the queue.
func (c *baseController) Run(ctx context.Context, workers int) {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	c.logger.WithField("workers", workers).Info("Starting controller")
	for i := 0; i < workers; i++ {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	<-ctx.Done()
	c.logger.Info("Stopping controller")
}

func (c *baseController) worker(ctx context.Context) {
	for c.processNextWorkItem(ctx) {
	}
}

func (c *baseController) processNextWorkItem(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	c.handleErr(key, c.sync(ctx, key))
	return true
}

func (c *baseController) handleErr(key string, err error) {
	if err == nil {
		c.queue.Forget(key)
		return
	}
	log := c.logger.WithField("key", key).WithError(err)
	if c.queue.NumRequeues(key) < maxRetries {
		log.Warn("Sync failed, will retry")
		c.queue.AddRateLimited(key)
		return
	}
	log.Error("Sync failed too often, dropping the key until the object changes")
	c.queue.Forget(key)
}

// enqueue adds an informer object's key; tombstones of deleted objects work too.
func (c *baseController) enqueue(obj interface{}) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(fmt.Errorf("%s: cannot get key of %T: %w", c.name, obj, err))
		return
	}
	c.queue.Add(key)
}

// nameFromKey strips the namespace: every Strata object the controllers sync
// lives in the manager's namespace.
func nameFromKey(key string) (string, error) {
	_, name, err := cache.SplitMetaNamespaceKey(key)
	return name, err
}

package kit

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// RetryBackoff bounds how a failing key is retried: exponentially from
// BaseDelay, never waiting longer than MaxDelay. A key is never dropped: with
// resync 0 nothing else would bring it back until some unrelated change.
type RetryBackoff struct {
	BaseDelay time.Duration
	MaxDelay  time.Duration
}

// DefaultRetryBackoff is what the manager uses unless --max-retry-delay says
// otherwise. client-go's default cap (1000 s) would leave a volume waiting a
// quarter of an hour after a fault clears; two minutes keeps a persistently
// failing key cheap while recovery stays prompt.
var DefaultRetryBackoff = RetryBackoff{BaseDelay: 5 * time.Millisecond, MaxDelay: 2 * time.Minute}

// retryBackoff is set once at start (SetRetryBackoff), before any controller
// is built.
var retryBackoff = DefaultRetryBackoff

// SetRetryBackoff changes the retry bounds of controllers built afterwards.
func SetRetryBackoff(b RetryBackoff) {
	if b.BaseDelay <= 0 {
		b.BaseDelay = DefaultRetryBackoff.BaseDelay
	}
	if b.MaxDelay < b.BaseDelay {
		b.MaxDelay = b.BaseDelay
	}
	retryBackoff = b
}

// loudAfterRetries is when a failing key's log line turns from a warning into
// an error: by then the failure is not a passing conflict.
const loudAfterRetries = 15

// newRateLimiter is client-go's controller rate limiter (per-key exponential
// backoff, overall token bucket) with our cap.
func newRateLimiter(b RetryBackoff) workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](b.BaseDelay, b.MaxDelay),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// BaseController is the plumbing every controller shares: the rate-limited
// queue and the sample-controller worker loop around a sync function.
type BaseController struct {
	name         string
	ControllerID string // this manager's node name
	Logger       logrus.FieldLogger
	DS           *datastore.DataStore
	Recorder     record.EventRecorder
	Queue        workqueue.TypedRateLimitingInterface[string]
	Sync         func(ctx context.Context, key string) error
	// DataPlane reaches instance managers, for controllers that act
	// through the data plane (nil for the others).
	DataPlane engineapi.Connector
	// extra are further queues of other kinds of keys, each with its sync
	// (external-snapshotter keeps one queue per kind rather than prefixed keys).
	extra []keyQueue
}

// keyQueue is a queue of one kind of key and the sync for them.
type keyQueue struct {
	queue workqueue.TypedRateLimitingInterface[string]
	sync  func(ctx context.Context, key string) error
}

// AddQueue makes another queue, named name, whose keys sync runs.
func (c *BaseController) AddQueue(name string, sync func(ctx context.Context, key string) error) workqueue.TypedRateLimitingInterface[string] {
	q := newQueue(name)
	c.extra = append(c.extra, keyQueue{queue: q, sync: sync})
	return q
}

func newQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(newRateLimiter(retryBackoff),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
}

func NewBaseController(name, controllerID string, logger logrus.FieldLogger, ds *datastore.DataStore,
	recorder record.EventRecorder) *BaseController {
	return &BaseController{
		name:         name,
		ControllerID: controllerID,
		Logger:       logger.WithField("controller", name),
		DS:           ds,
		Recorder:     recorder,
		Queue:        newQueue(name),
	}
}

// Run starts workers on every queue and blocks until ctx ends, then shuts
// the queues down.
func (c *BaseController) Run(ctx context.Context, workers int) {
	defer utilruntime.HandleCrash()
	queues := append([]keyQueue{{queue: c.Queue, sync: c.Sync}}, c.extra...)
	for _, q := range queues {
		defer q.queue.ShutDown()
	}
	c.Logger.WithField("workers", workers).Info("Starting controller")
	for _, q := range queues {
		for i := 0; i < workers; i++ {
			go wait.UntilWithContext(ctx, func(ctx context.Context) { c.worker(ctx, q) }, time.Second)
		}
	}
	<-ctx.Done()
	c.Logger.Info("Stopping controller")
}

func (c *BaseController) worker(ctx context.Context, q keyQueue) {
	for c.processNextWorkItem(ctx, q) {
	}
}

func (c *BaseController) processNextWorkItem(ctx context.Context, q keyQueue) bool {
	key, quit := q.queue.Get()
	if quit {
		return false
	}
	defer q.queue.Done(key)
	c.handleErr(q.queue, key, q.sync(ctx, key))
	return true
}

func (c *BaseController) handleErr(queue workqueue.TypedRateLimitingInterface[string], key string, err error) {
	if err == nil {
		queue.Forget(key)
		return
	}
	retries := queue.NumRequeues(key)
	log := c.Logger.WithField("key", key).WithField("retries", retries).WithError(err)
	if retries < loudAfterRetries {
		log.Warn("Sync failed, will retry")
	} else {
		log.Error("Sync keeps failing, will retry")
	}
	queue.AddRateLimited(key)
}

// Enqueue adds an informer object's key; tombstones of deleted objects work too.
func (c *BaseController) Enqueue(obj interface{}) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(fmt.Errorf("%s: cannot get key of %T: %w", c.name, obj, err))
		return
	}
	c.Queue.Add(key)
}

// EnqueueName adds the key of the object named name in the manager's
// namespace ("" is none).
func (c *BaseController) EnqueueName(name string) {
	if name != "" {
		c.Queue.Add(c.DS.Namespace + "/" + name)
	}
}

// EnqueueOnChange is the handler of a controller's own kind: every add,
// update and delete enqueues the object's key.
func (c *BaseController) EnqueueOnChange() cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    c.Enqueue,
		UpdateFunc: func(_, obj interface{}) { c.Enqueue(obj) },
		DeleteFunc: c.Enqueue,
	}
}

// EnqueueEveryKey adds the key of every object informer holds.
func (c *BaseController) EnqueueEveryKey(informer cache.SharedIndexInformer) func() {
	return func() {
		for _, key := range informer.GetStore().ListKeys() {
			c.Queue.Add(key)
		}
	}
}

// NameFromKey strips the namespace: every Strata object the controllers sync
// lives in the manager's namespace.
func NameFromKey(key string) (string, error) {
	_, name, err := cache.SplitMetaNamespaceKey(key)
	return name, err
}

// OnInstanceManagerStateChange calls fn with the node of an InstanceManager
// whose state changed (running, error, unknown) or that went away: replicas
// and engines there may now start, or must be judged unreachable, and
// replicas waiting for a node may now be placed. Status rewrites that keep
// the state call nothing.
func (c *BaseController) OnInstanceManagerStateChange(fn func(node string)) error {
	_, err := c.DS.InstanceManagers.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: OnUpdate(func(o, n *v1beta1.InstanceManager) {
			if o.Status.CurrentState != n.Status.CurrentState {
				fn(n.Spec.NodeID)
			}
		}),
		DeleteFunc: OnDelete(func(im *v1beta1.InstanceManager) { fn(im.Spec.NodeID) }),
	})
	return err
}

// EnqueueByNode adds every object of informer placed on node (by-node index).
func (c *BaseController) EnqueueByNode(informer cache.SharedIndexInformer, node string) {
	for _, obj := range c.OnNode(informer, node) {
		c.Enqueue(obj)
	}
}

// OnNode lists the cached objects of informer placed on node (by-node index).
func (c *BaseController) OnNode(informer cache.SharedIndexInformer, node string) []interface{} {
	objs, err := informer.GetIndexer().ByIndex(datastore.IndexByNode, node)
	if err != nil {
		c.Logger.WithError(err).WithField("node", node).Warn("Cannot list the node's objects")
	}
	return objs
}

// EnqueueVolumesWhere enqueues every volume keep accepts (for a change that
// may move many: node readiness, a target becoming available).
func (c *BaseController) EnqueueVolumesWhere(keep func(*v1beta1.Volume) bool) {
	vols, err := c.DS.Volumes.ListRO(nil)
	if err != nil {
		return
	}
	for _, v := range vols {
		if keep(v) {
			c.Enqueue(v)
		}
	}
}

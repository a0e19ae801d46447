package backup

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// RecurringJobController runs each RecurringJob on its cron schedule (issue
// 15, seed snapshot-crd story 1): one alive manager owns a job
// (status.ownerID), sleeps until its next tick with the queue's AddAfter,
// records the tick, then runs the task on the selected volumes beside the
// workers and hands the outcome back to the job's next sync. There is no
// resync: a job's queue key comes back only at its tick, when its spec
// changes, when its run ends, or when a node's readiness flips (ownership
// may move).
type RecurringJobController struct {
	*kit.BaseController

	// Bounds of a run's waits, so a run never hangs on one volume; tests
	// shorten them.
	snapshotWait time.Duration
	backupWait   time.Duration
	pollInterval time.Duration

	mu sync.Mutex
	// runCtx is the context runs go on under (the controller's Run).
	runCtx context.Context
	// runs are the runs of this manager, by job key, until their outcome is
	// recorded in the job's status.
	runs map[string]*jobRun
}

// NewRecurringJobController wires the controller of node controllerID;
// dataPlane lets snapshot-cleanup purge a volume's removed snapshots.
func NewRecurringJobController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector) (*RecurringJobController, error) {
	c := &RecurringJobController{
		BaseController: kit.NewBaseController("strata-recurring-job", controllerID, logger, ds, recorder),
		snapshotWait:   defaultRecurringSnapshotWait, backupWait: defaultRecurringBackupWait,
		pollInterval: defaultRecurringPollInterval,
		runCtx:       context.Background(), runs: map[string]*jobRun{},
	}
	c.DataPlane = dataPlane
	c.Sync = c.syncRecurringJob
	if err := c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(ds.RecurringJobs.Informer())); err != nil {
		return nil, err
	}
	// Volumes are not watched: which volumes a job runs on is decided when
	// it runs, so a label change has nothing to enqueue.
	if _, err := ds.RecurringJobs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.Enqueue,
		// A new spec (schedule, task) needs a look; our own status writes
		// do not.
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.RecurringJob) {
			if o.Generation != n.Generation || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
				c.Enqueue(n)
			}
		}),
		// The sync finds it gone and cancels a run in flight.
		DeleteFunc: c.Enqueue,
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Run keeps ctx for the runs, then runs the workers.
func (c *RecurringJobController) Run(ctx context.Context, workers int) {
	c.mu.Lock()
	c.runCtx = ctx
	c.mu.Unlock()
	c.BaseController.Run(ctx, workers)
}

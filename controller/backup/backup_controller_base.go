package backup

import (
	"context"
	"sync"

	"github.com/sirupsen/logrus"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// BackupController takes the backups Backup CRs ask for (issue 15): it
// finds or takes the snapshot, attaches a detached volume through a
// backup-controller ticket owned by the Backup, has the instance manager
// of the engine's node upload the snapshot to the BackupTarget named
// "default" (SnapshotBackup), follows the job through this node's instance
// cache, and records the result as the BackupTarget controller's mirror
// would. Deleting a Backup deletes its manifest from the target.
type BackupController struct {
	*kit.BaseController
	// instances is this node's instance cache: a backup job's progress and
	// end come from it. Nil on a node without an instance manager, which
	// then takes no backups.
	instances *kit.InstanceCache
	// storeFor opens a target's store; tests replace it.
	storeFor func(url string, secret map[string][]byte) (backupstore.ObjectStore, error)

	mu sync.Mutex
	// retries are the failed jobs of backups this manager runs, by UID.
	retries *kit.JobRetries
	// verifies are the verify actions this manager runs or ran, by UID
	// (backup_verify.go); runCtx is what they run under (Run's).
	verifies map[k8stypes.UID]*verifyRun
	runCtx   context.Context
}

// NewBackupController wires the backup controller of node controllerID.
func NewBackupController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string, dataPlane engineapi.Connector, instances *kit.InstanceCache) (*BackupController, error) {
	c := &BackupController{
		BaseController: kit.NewBaseController("strata-backup", controllerID, logger, ds, recorder),
		instances:      instances, storeFor: backupstore.StoreFor, retries: kit.NewJobRetries(),
		verifies: map[k8stypes.UID]*verifyRun{}, runCtx: context.Background(),
	}
	c.DataPlane = dataPlane
	c.Sync = c.syncBackup
	if err := c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(ds.Backups.Informer())); err != nil {
		return nil, err
	}
	if _, err := ds.Backups.Informer().AddEventHandler(c.EnqueueOnChange()); err != nil {
		return nil, err
	}
	if _, err := ds.Snapshots.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(s *v1beta1.Snapshot) { c.enqueueBackupsOf(s.Spec.Volume) }),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Snapshot) {
			if o.Status.ReadyToUse != n.Status.ReadyToUse || o.Status.Error != n.Status.Error ||
				(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
				c.enqueueBackupsOf(n.Spec.Volume)
			}
		}),
	}); err != nil {
		return nil, err
	}
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Volume) {
			if o.Status.State != n.Status.State || o.Status.CurrentNodeID != n.Status.CurrentNodeID ||
				o.Spec.NodeID != n.Spec.NodeID {
				c.enqueueBackupsOf(n.Name)
			}
		}),
	}); err != nil {
		return nil, err
	}
	// A target created, fixed or made available again lets waiting backups go on.
	if _, err := ds.BackupTargets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(*v1beta1.BackupTarget) { c.enqueueUnfinished() }),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.BackupTarget) {
			// Not every poll (lastSyncedAt): only what may unblock a backup.
			if o.Status.Available != n.Status.Available || o.Generation != n.Generation {
				c.enqueueUnfinished()
			}
		}),
	}); err != nil {
		return nil, err
	}
	if instances != nil {
		// An engine's instance carries its backup jobs' status.
		instances.OnChange(c.enqueueBackupsOfEngine)
		instances.OnSynced(c.enqueueUnfinished)
	}
	return c, nil
}

// enqueueBackupsOfEngine enqueues the unfinished backups of the volume an
// instance serves (replica instances are no engine and enqueue nothing).
func (c *BackupController) enqueueBackupsOfEngine(name string) {
	if e, err := c.DS.Engines.GetRO(name); err == nil {
		c.enqueueBackupsOf(e.Spec.VolumeName)
	}
}

// enqueueBackupsOf enqueues a volume's unfinished backups (by-volume index)
// and the ones being deleted.
func (c *BackupController) enqueueBackupsOf(volume string) {
	backups, err := c.DS.Backups.ListByIndexRO(datastore.IndexByVolume, volume)
	if err != nil {
		c.Logger.WithError(err).WithField("volume", volume).Warn("Cannot list the backups of a volume")
		return
	}
	for _, b := range backups {
		if !kit.BackupFinished(b) || b.DeletionTimestamp != nil {
			c.Enqueue(b)
		}
	}
}

// enqueueUnfinished enqueues every backup still to be taken.
func (c *BackupController) enqueueUnfinished() {
	backups, err := c.DS.Backups.ListRO(nil)
	if err != nil {
		return
	}
	for _, b := range backups {
		if !kit.BackupFinished(b) || b.DeletionTimestamp != nil {
			c.Enqueue(b)
		}
	}
}

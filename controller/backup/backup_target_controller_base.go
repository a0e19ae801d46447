package backup

import (
	"sync"

	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// BackupTargetController checks each BackupTarget's store (availability
// condition, last sync time) and mirrors what the store holds as
// BackupVolume and Backup CRs, so a cluster pointed at an existing target
// lists its backups, and removes a BackupVolume nothing holds any more
// (backup_volume_prune.go). It looks again every spec.pollInterval. On a
// second queue it garbage-collects the target (backup_target_gc.go).
type BackupTargetController struct {
	*kit.BaseController
	// storeFor opens a target's store; tests replace it.
	storeFor func(url string, secret map[string][]byte) (backupstore.ObjectStore, error)
	// gcQueue holds the keys of targets whose GC may be due.
	gcQueue workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	gcRuns map[string]gcMemory // by target key
}

// NewBackupTargetController wires the controller to the BackupTarget informer.
func NewBackupTargetController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*BackupTargetController, error) {
	c := &BackupTargetController{BaseController: kit.NewBaseController("strata-backup-target", controllerID, logger, ds, recorder),
		storeFor: backupstore.StoreFor, gcRuns: map[string]gcMemory{}}
	c.Sync = c.syncBackupTarget
	c.gcQueue = c.AddQueue("strata-backup-target-gc", c.syncBackupTargetGC)
	enqueueAll := c.EnqueueEveryKey(ds.BackupTargets.Informer())
	if err := c.RequeueOnNodeReadyChange(func() { enqueueAll(); c.enqueueAllGC() }); err != nil {
		return nil, err
	}
	_, err := ds.BackupTargets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(func(t *v1beta1.BackupTarget) { c.Enqueue(t); c.enqueueGC(t) }),
		// A new spec, not our own status write, needs a look.
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.BackupTarget) {
			if o.Generation != n.Generation {
				c.Enqueue(n)
			}
			if gcKeysChanged(o, n) {
				c.enqueueGC(n)
			}
		}),
		// Forgets its GC memory. Untyped: a tombstone's key is enough.
		DeleteFunc: c.enqueueGC,
	})
	if err != nil {
		return nil, err
	}
	// A new GC interval reschedules every target's timer.
	_, err = ds.Settings.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Setting) {
			if n.Name == string(types.SettingBackupGCInterval) && o.Value != n.Value {
				c.enqueueAllGC()
			}
		}),
	})
	if err != nil {
		return nil, err
	}
	// The last Backup of a volume or the volume deleted: its BackupVolume
	// may go, or show it is empty (backup_volume_prune.go).
	_, err = ds.Backups.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: kit.OnDelete(func(b *v1beta1.Backup) { c.enqueueIfBackupVolumeEmptied(backupVolumeName(b)) }),
	})
	if err != nil {
		return nil, err
	}
	_, err = ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: kit.OnDelete(func(v *v1beta1.Volume) { c.enqueueIfBackupVolumeEmptied(v.Name) }),
	})
	return c, err
}

func (c *BackupTargetController) enqueueGC(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		c.gcQueue.Add(key)
	}
}

func (c *BackupTargetController) enqueueAllGC() {
	for _, key := range c.DS.BackupTargets.Informer().GetStore().ListKeys() {
		c.gcQueue.Add(key)
	}
}

package controller

import (
	"github.com/sirupsen/logrus"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// BackupTargetController checks each BackupTarget's store (availability
// condition, last sync time) and mirrors what the store holds as
// BackupVolume and Backup CRs, so a cluster pointed at an existing target
// lists its backups. It looks again every spec.pollInterval.
type BackupTargetController struct {
	*baseController
	// storeFor opens a target's store; tests replace it.
	storeFor func(url string, secret map[string][]byte) (backupstore.ObjectStore, error)
}

// NewBackupTargetController wires the controller to the BackupTarget informer.
func NewBackupTargetController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*BackupTargetController, error) {
	c := &BackupTargetController{baseController: newBaseController("strata-backup-target", controllerID, logger, ds, recorder),
		storeFor: backupstore.StoreFor}
	c.sync = c.syncBackupTarget
	if err := c.requeueOnNodeReadyChange(c.enqueueEveryKey(ds.BackupTargets.Informer())); err != nil {
		return nil, err
	}
	_, err := ds.BackupTargets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		// A new spec, not our own status write, needs a look.
		UpdateFunc: func(oldObj, newObj any) {
			if oldObj.(*v1beta1.BackupTarget).Generation != newObj.(*v1beta1.BackupTarget).Generation {
				c.enqueue(newObj)
			}
		},
	})
	return c, err
}

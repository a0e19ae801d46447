package attachment

import (
	"sync"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// VolumeAttachmentController is the attach/detach (AD) controller: it keeps
// one VolumeAttachment per Volume, turns the attachment tickets into the
// volume's spec.nodeID, spec.migrationNodeID, spec.disableFrontend and
// spec.lastAttachedBy (it is their only writer), reports each ticket's
// status, and removes tickets whose owner is gone.
//
// Its key is the namespace/name shared by a Volume and its VolumeAttachment.
type VolumeAttachmentController struct {
	*kit.BaseController
	lookups map[schema.GroupKind]ownerLookup
	// unwatchedKindsLogged holds the ticket owner kinds already logged as
	// not watched, so each is logged once.
	unwatchedKindsLogged sync.Map
}

// NewVolumeAttachmentController wires the AD controller to the VolumeAttachment
// and Volume informers, and to the informers of the ticket owners it reaps.
func NewVolumeAttachmentController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*VolumeAttachmentController, error) {
	c := &VolumeAttachmentController{
		BaseController: kit.NewBaseController("strata-volume-attachment", controllerID, logger, ds, recorder),
	}
	c.Sync = c.syncVolumeAttachment
	c.lookups = c.ownerLookups()
	if err := c.RequeueOnNodeReadyChange(c.EnqueueEveryKey(ds.Volumes.Informer())); err != nil {
		return nil, err
	}
	if _, err := ds.VolumeAttachments.Informer().AddEventHandler(c.EnqueueOnChange()); err != nil {
		return nil, err
	}

	volumeOwner := c.ownerHandlers(gkVolume)
	if _, err := ds.Volumes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		// A new volume gets its VolumeAttachment; the key is the same.
		AddFunc: c.Enqueue,
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.Volume) {
			if volumeChangeMattersForAD(o, n) {
				c.Enqueue(n)
			}
			volumeOwner.UpdateFunc(o, n)
		}),
		// The garbage collector removes the volume's own VolumeAttachment;
		// tickets the volume owns elsewhere (clones) are reaped.
		DeleteFunc: volumeOwner.DeleteFunc,
	}); err != nil {
		return nil, err
	}
	for gk, informer := range map[schema.GroupKind]cache.SharedIndexInformer{
		gkSnapshot:                ds.Snapshots.Informer(),
		gkBackup:                  ds.Backups.Informer(),
		gkBackingImage:            ds.BackingImages.Informer(),
		gkSnapshotGroup:           ds.SnapshotGroups.Informer(),
		gkStorageVolumeAttachment: ds.StorageVolumeAttachments.Informer(),
		gkLease:                   ds.APITicketLeases.Informer(),
	} {
		if _, err := informer.AddEventHandler(c.ownerHandlers(gk)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// volumeChangeMattersForAD tells whether a volume update changed a field
// the AD logic reads; the rest of the volume's churn (sizes, conditions
// other than BackingImageReady, endpoints) enqueues nothing.
func volumeChangeMattersForAD(o, n *v1beta1.Volume) bool {
	return o.Spec.NodeID != n.Spec.NodeID ||
		o.Spec.MigrationNodeID != n.Spec.MigrationNodeID ||
		o.Spec.DisableFrontend != n.Spec.DisableFrontend ||
		o.Spec.Migratable != n.Spec.Migratable ||
		o.Status.State != n.Status.State ||
		o.Status.CurrentNodeID != n.Status.CurrentNodeID ||
		o.Status.CurrentMigrationNodeID != n.Status.CurrentMigrationNodeID ||
		o.Status.OwnerID != n.Status.OwnerID ||
		o.Status.Robustness != n.Status.Robustness ||
		fillStatusChanged(o, n) ||
		kit.BackingImageConditionChanged(o, n) ||
		(o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
}

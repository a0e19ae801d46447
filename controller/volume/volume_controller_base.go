package volume

import (
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// VolumeController owns a volume's engine and replicas: it creates and
// schedules them, drives attach and detach as volume.spec.nodeID says (the
// VolumeAttachment controller writes that), replaces failed replicas,
// salvages a faulted volume, expands a detached one, and cleans up on delete.
type VolumeController struct {
	*kit.BaseController
	// created are the replicas this manager created that its cache may not
	// show yet, by volume; see awaitCreatedReplicas.
	created createdReplicas
}

// NewVolumeController wires the volume controller of node controllerID.
func NewVolumeController(logger logrus.FieldLogger, ds *datastore.DataStore, recorder record.EventRecorder,
	controllerID string) (*VolumeController, error) {
	c := &VolumeController{BaseController: kit.NewBaseController("strata-volume", controllerID, logger, ds, recorder),
		created: createdReplicas{byVolume: map[string]map[string]time.Time{}}}
	c.Sync = c.syncVolume

	if _, err := ds.Volumes.Informer().AddEventHandler(c.EnqueueOnChange()); err != nil {
		return nil, err
	}
	// An engine or replica change concerns exactly its volume.
	if _, err := ds.Engines.Informer().AddEventHandler(
		kit.OnEveryChange(func(e *v1beta1.Engine) { c.enqueueVolume(e.Spec.VolumeName) })); err != nil {
		return nil, err
	}
	if _, err := ds.Replicas.Informer().AddEventHandler(
		kit.OnEveryChange(func(r *v1beta1.Replica) { c.enqueueVolume(r.Spec.VolumeName) })); err != nil {
		return nil, err
	}
	// A volume on a backing image says whether the image can serve it; the
	// image's progress and last-use times enqueue nothing.
	if _, err := ds.BackingImages.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: kit.OnAdd(c.enqueueVolumesOn),
		UpdateFunc: kit.OnUpdate(func(o, n *v1beta1.BackingImage) {
			if kit.BackingImageVerdictChanged(o, n) {
				c.enqueueVolumesOn(n)
			}
		}),
		DeleteFunc: kit.OnDelete(c.enqueueVolumesOn),
	}); err != nil {
		return nil, err
	}
	// A deleting volume waits for its snapshots to go.
	if _, err := ds.Snapshots.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: kit.OnDelete(func(s *v1beta1.Snapshot) { c.enqueueVolume(s.Spec.Volume) }),
	}); err != nil {
		return nil, err
	}
	if err := c.OnInstanceManagerStateChange(c.enqueueVolumesConcerning); err != nil {
		return nil, err
	}
	enqueueAll := c.EnqueueEveryKey(ds.Volumes.Informer())
	// Turning snapshot purge off or on decides every volume's
	// SnapshotSpaceRetained condition; an admin flips it rarely.
	if _, err := ds.Settings.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: kit.OnUpdate(func(o, st *v1beta1.Setting) {
			if st.Name == string(types.SettingDisableSnapshotPurge) && o.Value != st.Value {
				enqueueAll()
			}
		}),
	}); err != nil {
		return nil, err
	}
	return c, c.RequeueOnNodeReadyChange(enqueueAll)
}

// enqueueVolume enqueues a volume by name ("" is none: an object of no volume).
func (c *VolumeController) enqueueVolume(volume string) { c.EnqueueName(volume) }

// enqueueVolumeOf enqueues the volume of a cached engine or replica, as the
// by-node index lists them.
func (c *VolumeController) enqueueVolumeOf(obj any) {
	switch o := obj.(type) {
	case *v1beta1.Engine:
		c.enqueueVolume(o.Spec.VolumeName)
	case *v1beta1.Replica:
		c.enqueueVolume(o.Spec.VolumeName)
	}
}

// enqueueVolumesConcerning adds the volumes a change of node's data plane
// affects: those with a replica or an engine there, and those waiting for a
// node to place a replica on.
func (c *VolumeController) enqueueVolumesConcerning(node string) {
	for _, informer := range []cache.SharedIndexInformer{c.DS.Replicas.Informer(), c.DS.Engines.Informer()} {
		for _, obj := range c.OnNode(informer, node) {
			c.enqueueVolumeOf(obj)
		}
	}
	volumes, err := c.DS.Volumes.ListRO(nil)
	if err != nil {
		c.Logger.WithError(err).Warn("Cannot list volumes")
		return
	}
	for _, v := range volumes {
		if cond := meta.FindStatusCondition(v.Status.Conditions, v1beta1.VolumeConditionScheduled); cond != nil && cond.Status == metav1.ConditionFalse {
			c.Queue.Add(c.DS.Namespace + "/" + v.Name)
		}
	}
}

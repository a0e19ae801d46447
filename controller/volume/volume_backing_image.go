package volume

import (
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// EventReasonVolumeBackingImageFailed is the Warning a volume gets when its
// backing image fails.
const EventReasonVolumeBackingImageFailed = "BackingImageFailed"

// enqueueVolumesOn enqueues the volumes built on an image.
func (c *VolumeController) enqueueVolumesOn(bi *v1beta1.BackingImage) {
	volumes, err := c.DS.Volumes.ListByIndexRO(datastore.IndexByBackingImage, bi.Name)
	if err != nil {
		c.Logger.WithError(err).WithField("backingImage", bi.Name).Warn("Cannot list the volumes on a backing image")
		return
	}
	for _, v := range volumes {
		c.Enqueue(v)
	}
}

// updateBackingImageCondition judges the volume's backing image from the
// cache; a volume without one has no such condition.
func (s *volumeSync) updateBackingImageCondition() {
	name := s.v.Spec.BackingImage
	if name == "" {
		meta.RemoveStatusCondition(&s.v.Status.Conditions, kit.VolumeConditionBackingImageReady)
		return
	}
	bi, err := s.DS.BackingImages.GetRO(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return // keep the last verdict
	}
	if err != nil {
		bi = nil
	}
	ok, reason, message := kit.BackingImageVerdict(name, bi)
	s.setCondition(kit.VolumeConditionBackingImageReady, ok, reason, message)
}

// backingImageEvent warns when the volume's image turns failed or goes
// missing: `kubectl describe volume` then says why it does not attach.
func (s *volumeSync) backingImageEvent(old, cur *v1beta1.Volume) {
	c := kit.ImageBlocking(cur)
	if c == nil {
		return
	}
	if o := kit.ImageBlocking(old); o != nil && o.Reason == c.Reason {
		return
	}
	s.Recorder.Event(cur, corev1.EventTypeWarning, EventReasonVolumeBackingImageFailed, c.Message)
}

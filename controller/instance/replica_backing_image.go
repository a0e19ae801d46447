package instance

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// ReplicaConditionWaitingForBackingImage is True while a replica is held
// back because its backing image has no ready copy on its disk.
const ReplicaConditionWaitingForBackingImage = "WaitingForBackingImage"

// Reasons of the WaitingForBackingImage condition.
const (
	reasonBackingImageMissing   = "BackingImageMissing"
	reasonBackingImageRequested = "CopyRequested"
	reasonBackingImageCopying   = "CopyNotReady"
	reasonBackingImageReady     = "CopyReady"
	reasonBackingImageFailed    = "BackingImageFailed"
)

// backingFile finds the ready copy of the replica's backing image on its
// disk. When there is none it says why in the WaitingForBackingImage
// condition (asking for a copy on the disk if nobody has) and returns "":
// the replica is not started until the copy is ready, and the image's
// status change brings it back.
func (c *ReplicaController) backingFile(ctx context.Context, r *v1beta1.Replica) (string, error) {
	if r.Spec.BackingImage == "" {
		return "", nil
	}
	bi, err := c.DS.BackingImages.GetRO(r.Spec.BackingImage)
	if apierrors.IsNotFound(err) {
		setWaiting(r, reasonBackingImageMissing, fmt.Sprintf("backing image %s does not exist", r.Spec.BackingImage))
		return "", nil
	}
	if err != nil {
		return "", err
	}
	// An image with no ready copy and a failed one has nothing to copy: say
	// so, rather than "pending: waiting for the first copy" (issue 23), and
	// ask for no copy, whose spec write would also retry the failed fetch.
	if _, reason, msg := kit.BackingImageVerdict(bi.Name, bi); reason == kit.BackingImageReadyReasonFailed {
		setWaiting(r, reasonBackingImageFailed, msg)
		return "", nil
	}
	if _, wanted := bi.Spec.DiskFileSpecMap[r.Spec.DiskID]; !wanted {
		if err := c.requestCopy(ctx, bi, r.Spec.DiskID); err != nil {
			return "", fmt.Errorf("asking backing image %s for a copy on disk %s: %w", bi.Name, r.Spec.DiskID, err)
		}
		setWaiting(r, reasonBackingImageRequested, fmt.Sprintf("asked backing image %s for a copy on disk %s", bi.Name, r.Spec.DiskID))
		return "", nil
	}
	st := bi.Status.DiskFileStatusMap[r.Spec.DiskID]
	if st == nil || st.State != v1beta1.BackingImageStateReady || bi.Status.UUID == "" {
		why := "pending"
		if st != nil {
			why = string(st.State) // no percent: each step would rewrite the replica
			if st.Message != "" {
				why += ": " + st.Message
			}
		}
		setWaiting(r, reasonBackingImageCopying, fmt.Sprintf("the copy of backing image %s on disk %s is %s", bi.Name, r.Spec.DiskID, why))
		return "", nil
	}
	setNotWaiting(r)
	return kit.BackingImageFile(r.Spec.DiskPath, bi), nil
}

// setNotWaiting says the replica's copy is ready. It is also called for a
// replica whose instance exists: the status write that follows the start
// can meet a conflict, and the retry finds the instance and never asks
// backingFile again, which would leave the condition True for good.
func setNotWaiting(r *v1beta1.Replica) {
	if r.Spec.BackingImage == "" {
		return
	}
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: ReplicaConditionWaitingForBackingImage,
		Status: metav1.ConditionFalse, Reason: reasonBackingImageReady,
		Message: fmt.Sprintf("the copy of backing image %s on disk %s is ready", r.Spec.BackingImage, r.Spec.DiskID)})
}

// requestCopy adds the disk to the image's wanted copies.
func (c *ReplicaController) requestCopy(ctx context.Context, biRO *v1beta1.BackingImage, disk string) error {
	if biRO.DeletionTimestamp != nil {
		return fmt.Errorf("backing image %s is being deleted", biRO.Name)
	}
	bi := biRO.DeepCopy()
	if bi.Spec.DiskFileSpecMap == nil {
		bi.Spec.DiskFileSpecMap = map[string]*v1beta1.BackingImageDiskFileSpec{}
	}
	bi.Spec.DiskFileSpecMap[disk] = &v1beta1.BackingImageDiskFileSpec{}
	_, err := c.DS.BackingImages.Update(ctx, bi)
	return err
}

func setWaiting(r *v1beta1.Replica, reason, msg string) {
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: ReplicaConditionWaitingForBackingImage,
		Status: metav1.ConditionTrue, Reason: reason, Message: msg})
}

package kit

import (
	"fmt"
	"maps"
	"slices"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VolumeConditionBackingImageReady tells, for a volume on a backing image,
// whether the image has a ready copy to build the volume's replicas on.
// Before it a volume on a failed image looked healthy and waited to attach
// for ever with nothing saying why (issue 23). Robustness is left alone:
// it is about the replicas' data, which nothing lost; this condition, the
// attachment tickets' status and a Warning event say why it cannot attach.
const VolumeConditionBackingImageReady = "BackingImageReady"

// Reasons of the BackingImageReady condition.
const (
	BackingImageReadyReasonReady   = "CopyReady"
	BackingImageReadyReasonPending = "NoCopyReady"
	BackingImageReadyReasonFailed  = "BackingImageFailed"
	BackingImageReadyReasonMissing = "BackingImageMissing"
)

// BackingImageVerdict is the BackingImageReady condition of a volume on
// image name (bi nil: the image does not exist). Ready once any wanted copy
// is ready: every other disk copies from it. Failed while no copy is ready
// and one failed: nothing can be copied, the volume cannot attach. The
// messages carry no progress, so a download costs the volume no writes.
// Pure: the condition, the BackingImage handler's filter and the replica's
// condition share it.
func BackingImageVerdict(name string, bi *v1beta1.BackingImage) (ok bool, reason, message string) {
	switch {
	case bi == nil:
		return false, BackingImageReadyReasonMissing, fmt.Sprintf("backing image %s does not exist", name)
	case len(ReadyCopies(bi)) > 0:
		return true, BackingImageReadyReasonReady, fmt.Sprintf("backing image %s has a ready copy", name)
	}
	if failure := imageFailure(bi); failure != "" {
		return false, BackingImageReadyReasonFailed, fmt.Sprintf("backing image %s failed: %s", name, failure)
	}
	return false, BackingImageReadyReasonPending, fmt.Sprintf("backing image %s has no ready copy yet", name)
}

// imageFailure is the first failed wanted copy ("disk <uuid>: <why>"), in
// disk order so every reader names the same one; "" when none failed.
func imageFailure(bi *v1beta1.BackingImage) string {
	for _, disk := range slices.Sorted(maps.Keys(bi.Status.DiskFileStatusMap)) {
		st := bi.Status.DiskFileStatusMap[disk]
		if _, wanted := bi.Spec.DiskFileSpecMap[disk]; wanted && st != nil && st.State == v1beta1.BackingImageStateFailed {
			return fmt.Sprintf("disk %s: %s", disk, st.Message)
		}
	}
	return ""
}

// BackingImageVerdictChanged: an image update changed what its volumes'
// condition says; its download progress and last-use times do not.
func BackingImageVerdictChanged(o, n *v1beta1.BackingImage) bool {
	ook, oreason, omsg := BackingImageVerdict(o.Name, o)
	nok, nreason, nmsg := BackingImageVerdict(n.Name, n)
	return ook != nok || oreason != nreason || omsg != nmsg
}

// ImageNotReady is the volume's BackingImageReady condition while False.
func ImageNotReady(vol *v1beta1.Volume) *metav1.Condition {
	c := meta.FindStatusCondition(vol.Status.Conditions, VolumeConditionBackingImageReady)
	if c == nil || c.Status != metav1.ConditionFalse {
		return nil
	}
	return c
}

// ImageBlocking is the volume's BackingImageReady condition while the image
// failed or is gone: the volume cannot attach until that changes.
func ImageBlocking(vol *v1beta1.Volume) *metav1.Condition {
	c := ImageNotReady(vol)
	if c == nil || (c.Reason != BackingImageReadyReasonFailed && c.Reason != BackingImageReadyReasonMissing) {
		return nil
	}
	return c
}

// BackingImageConditionChanged: the AD controller's ticket messages quote
// the condition, so a change of it is a change for them.
func BackingImageConditionChanged(o, n *v1beta1.Volume) bool {
	oc := meta.FindStatusCondition(o.Status.Conditions, VolumeConditionBackingImageReady)
	nc := meta.FindStatusCondition(n.Status.Conditions, VolumeConditionBackingImageReady)
	if oc == nil || nc == nil {
		return (oc == nil) != (nc == nil)
	}
	return oc.Status != nc.Status || oc.Reason != nc.Reason || oc.Message != nc.Message
}

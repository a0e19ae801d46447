package kit

import (
	"testing"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/assert"
)

func TestBackingImageVerdict(t *testing.T) {
	const ready, failed, pending = v1beta1.BackingImageStateReady, v1beta1.BackingImageStateFailed, v1beta1.BackingImageStatePending
	withMessage := func(disk, msg string) func(*v1beta1.BackingImage) {
		return func(bi *v1beta1.BackingImage) { bi.Status.DiskFileStatusMap[disk].Message = msg }
	}
	tests := []struct {
		name                string
		bi                  *v1beta1.BackingImage
		wantOK              bool
		wantReason, wantMsg string
	}{
		{name: "missing", wantReason: BackingImageReadyReasonMissing, wantMsg: "backing image img does not exist"},
		{name: "a ready copy", bi: fixture.Image(map[string]v1beta1.BackingImageState{"d1": ready, "d2": pending}),
			wantOK: true, wantReason: BackingImageReadyReasonReady, wantMsg: "backing image img has a ready copy"},
		{name: "a ready copy and a failed one: the others copy from the ready one",
			bi:     fixture.Image(map[string]v1beta1.BackingImageState{"d1": ready, "d2": failed}, withMessage("d2", "copying: EIO")),
			wantOK: true, wantReason: BackingImageReadyReasonReady, wantMsg: "backing image img has a ready copy"},
		{name: "being fetched", bi: fixture.Image(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateInProgress}),
			wantReason: BackingImageReadyReasonPending, wantMsg: "backing image img has no ready copy yet"},
		{name: "the fetch failed", bi: fixture.FailedImage(),
			wantReason: BackingImageReadyReasonFailed, wantMsg: "backing image img failed: disk uuid-node-1: " + fixture.BadSumMsg},
		{name: "the first failure in disk order",
			bi: fixture.Image(map[string]v1beta1.BackingImageState{"d2": failed, "d1": failed, "d0": pending},
				withMessage("d1", "one"), withMessage("d2", "two")),
			wantReason: BackingImageReadyReasonFailed, wantMsg: "backing image img failed: disk d1: one"},
		{name: "a failed copy no longer wanted is not the image's failure",
			bi: fixture.Image(map[string]v1beta1.BackingImageState{"d1": pending}, func(bi *v1beta1.BackingImage) {
				bi.Status.DiskFileStatusMap["d9"] = &v1beta1.BackingImageDiskFileStatus{State: failed, Message: "old"}
			}),
			wantReason: BackingImageReadyReasonPending, wantMsg: "backing image img has no ready copy yet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason, msg := BackingImageVerdict("img", tc.bi)
			assert.Equal(t, tc.wantOK, ok)
			assert.Equal(t, tc.wantReason, reason)
			assert.Equal(t, tc.wantMsg, msg)
		})
	}
}

// A volume's image changes concern it only when the verdict changes.
func TestBackingImageVerdictChanged(t *testing.T) {
	downloading := fixture.Image(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateInProgress},
		func(bi *v1beta1.BackingImage) { bi.Status.DiskFileStatusMap["d1"].Progress = 10 })
	tests := []struct {
		name   string
		mutate func(*v1beta1.BackingImage)
		want   bool
	}{
		{"progress", func(bi *v1beta1.BackingImage) { bi.Status.DiskFileStatusMap["d1"].Progress = 60 }, false},
		{"last use", func(bi *v1beta1.BackingImage) { bi.Status.DiskLastRefAtMap["d1"] = "x" }, false},
		{"another disk asked for", func(bi *v1beta1.BackingImage) {
			bi.Spec.DiskFileSpecMap["d2"] = &v1beta1.BackingImageDiskFileSpec{}
		}, false},
		{"failed", func(bi *v1beta1.BackingImage) {
			bi.Status.DiskFileStatusMap["d1"].State, bi.Status.DiskFileStatusMap["d1"].Message = v1beta1.BackingImageStateFailed, "x"
		}, true},
		{"ready", func(bi *v1beta1.BackingImage) {
			bi.Status.DiskFileStatusMap["d1"].State = v1beta1.BackingImageStateReady
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := downloading.DeepCopy()
			tc.mutate(n)
			assert.Equal(t, tc.want, BackingImageVerdictChanged(downloading, n))
		})
	}
}

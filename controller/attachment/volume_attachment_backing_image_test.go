package attachment

import (
	"testing"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit/kittest"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A ticket of a volume whose image failed says so, naming the image and
// the failure, instead of "the volume is attaching".
func TestTicketStatusesOnBackingImage(t *testing.T) {
	now := metav1.NewTime(dstest.Now)
	va := &v1beta1.VolumeAttachment{Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: fixture.Tickets(
		fixture.Ticket("pod", csi, "node-1"))}}
	attaching := func(mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
		return fixture.Volume(append([]func(*v1beta1.Volume){fixture.OnImage, func(v *v1beta1.Volume) {
			v.Spec.NodeID, v.Status.State = "node-1", v1beta1.VolumeStateAttaching
		}}, mut...)...)
	}
	downloading := fixture.Image(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateInProgress})
	tests := []struct {
		name                string
		vol                 *v1beta1.Volume
		wantReason, wantMsg string
	}{
		{"the image failed", attaching(kittest.ImageCondition(fixture.FailedImage())), TicketReasonBackingImageFailed,
			"the volume cannot attach: backing image img failed: disk uuid-node-1: " + fixture.BadSumMsg},
		{"the image is gone", attaching(kittest.ImageCondition(nil)), TicketReasonBackingImageFailed,
			"the volume cannot attach: backing image img does not exist"},
		{"the image is being fetched", attaching(kittest.ImageCondition(downloading)), TicketReasonWaitingToAttach,
			"the volume is attaching; backing image img has no ready copy yet"},
		{"the image is ready", attaching(kittest.ImageCondition(fixture.Image(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateReady}))),
			TicketReasonWaitingToAttach, "the volume is attaching"},
		{"the image failed but the volume is faulted too: the image is the cause",
			attaching(kittest.ImageCondition(fixture.FailedImage()), func(v *v1beta1.Volume) { v.Status.Robustness = v1beta1.VolumeRobustnessFaulted }),
			TicketReasonBackingImageFailed, "the volume cannot attach: backing image img failed: disk uuid-node-1: " + fixture.BadSumMsg},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ticketStatuses(tc.vol, va, now)
			c := meta.FindStatusCondition(got["pod"].Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied)
			require.NotNil(t, c)
			assert.False(t, got["pod"].Satisfied)
			assert.Equal(t, tc.wantReason, c.Reason)
			assert.Equal(t, tc.wantMsg, c.Message)
		})
	}
}

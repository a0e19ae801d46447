package instance

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// A replica on an image that failed says so rather than "pending: waiting
// for the first copy", and asks for no copy on its disk (a spec write
// would retry the failed fetch).
func TestReplicaWaitsOnBackingImage(t *testing.T) {
	pendingHere := func(bi *v1beta1.BackingImage) {
		bi.Spec.DiskFileSpecMap["uuid-node-2"] = &v1beta1.BackingImageDiskFileSpec{}
		bi.Status.DiskFileStatusMap["uuid-node-2"] = &v1beta1.BackingImageDiskFileStatus{State: v1beta1.BackingImageStatePending,
			Message: "waiting for the first copy, on disk uuid-node-1"}
	}
	inProgress := fixture.Image(map[string]v1beta1.BackingImageState{"uuid-node-1": v1beta1.BackingImageStateInProgress})
	inProgress.Status.FirstCopyDisk = "uuid-node-1"
	tests := []struct {
		name                string
		bi                  *v1beta1.BackingImage
		wantWrites          []string
		wantReason, wantMsg string
	}{
		{name: "failed, the copy here waiting for the first", bi: func() *v1beta1.BackingImage {
			bi := fixture.FailedImage()
			pendingHere(bi)
			return bi
		}(), wantReason: reasonBackingImageFailed, wantMsg: "backing image img failed: disk uuid-node-1: " + fixture.BadSumMsg},
		{name: "failed, no copy asked for here: none is", bi: fixture.FailedImage(), wantReason: reasonBackingImageFailed,
			wantMsg: "backing image img failed: disk uuid-node-1: " + fixture.BadSumMsg},
		{name: "the first copy on its way: waiting for it", bi: func() *v1beta1.BackingImage {
			bi := inProgress.DeepCopy()
			pendingHere(bi)
			return bi
		}(), wantReason: reasonBackingImageCopying,
			wantMsg: "the copy of backing image img on disk uuid-node-2 is pending: waiting for the first copy, on disk uuid-node-1"},
		{name: "no copy asked for here yet: asked", bi: inProgress, wantWrites: []string{"update backingimages img"},
			wantReason: reasonBackingImageRequested, wantMsg: "asked backing image img for a copy on disk uuid-node-2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{tc.bi}, nil)
			c, err := NewReplicaController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-2", "", fixture.NewFakeConnector(nil), nil)
			require.NoError(t, err)
			env.ClearActions()
			r := fixture.Replica("r2", "node-2", onReplicaImage)
			file, err := c.backingFile(context.Background(), r)
			require.NoError(t, err)
			assert.Empty(t, file)
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()), "API writes")
			cond := meta.FindStatusCondition(r.Status.Conditions, ReplicaConditionWaitingForBackingImage)
			require.NotNil(t, cond)
			assert.Equal(t, metav1.ConditionTrue, cond.Status)
			assert.Equal(t, tc.wantReason, cond.Reason)
			assert.Equal(t, tc.wantMsg, cond.Message)
		})
	}
}

func onReplicaImage(r *v1beta1.Replica) { r.Spec.BackingImage = "img" }

// The status write that follows a replica's start can meet a conflict; the
// retry finds the instance running and must still clear the condition (CI
// once saw a replica wait for good on an image it was already running on).
func TestRunningReplicaNoLongerWaits(t *testing.T) {
	r := fixture.Replica("r2", "node-2", onReplicaImage)
	r.Spec.DesireState = v1beta1.InstanceStateRunning
	setWaiting(r, reasonBackingImageCopying, "the copy of backing image img on disk uuid-node-2 is in-progress")
	c := &ReplicaController{}
	running := &engineapi.Instance{Name: "r2", State: engineapi.InstanceStateRunning}
	require.NoError(t, c.driveReplica(context.Background(), r, running, true))
	cond := meta.FindStatusCondition(r.Status.Conditions, ReplicaConditionWaitingForBackingImage)
	require.NotNil(t, cond)
	assert.Equal(t, metav1.ConditionFalse, cond.Status)
	assert.Equal(t, "the copy of backing image img on disk uuid-node-2 is ready", cond.Message)
}

package controller

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const badSumMsg = "downloading: checksum mismatch: spec.checksum is ab, the image's raw data has SHA-512 cd; " + notRetried

// failedImage is img with its only copy, on node-1's disk, failed as a
// checksum mismatch leaves it.
func failedImage() *v1beta1.BackingImage {
	return testImage(map[string]v1beta1.BackingImageState{"uuid-node-1": v1beta1.BackingImageStateFailed},
		func(bi *v1beta1.BackingImage) {
			bi.Status.DiskFileStatusMap["uuid-node-1"].Message = badSumMsg
			bi.Status.FirstCopyDisk = "uuid-node-1"
		})
}

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
		{name: "a ready copy", bi: testImage(map[string]v1beta1.BackingImageState{"d1": ready, "d2": pending}),
			wantOK: true, wantReason: BackingImageReadyReasonReady, wantMsg: "backing image img has a ready copy"},
		{name: "a ready copy and a failed one: the others copy from the ready one",
			bi:     testImage(map[string]v1beta1.BackingImageState{"d1": ready, "d2": failed}, withMessage("d2", "copying: EIO")),
			wantOK: true, wantReason: BackingImageReadyReasonReady, wantMsg: "backing image img has a ready copy"},
		{name: "being fetched", bi: testImage(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateInProgress}),
			wantReason: BackingImageReadyReasonPending, wantMsg: "backing image img has no ready copy yet"},
		{name: "the fetch failed", bi: failedImage(),
			wantReason: BackingImageReadyReasonFailed, wantMsg: "backing image img failed: disk uuid-node-1: " + badSumMsg},
		{name: "the first failure in disk order",
			bi: testImage(map[string]v1beta1.BackingImageState{"d2": failed, "d1": failed, "d0": pending},
				withMessage("d1", "one"), withMessage("d2", "two")),
			wantReason: BackingImageReadyReasonFailed, wantMsg: "backing image img failed: disk d1: one"},
		{name: "a failed copy no longer wanted is not the image's failure",
			bi: testImage(map[string]v1beta1.BackingImageState{"d1": pending}, func(bi *v1beta1.BackingImage) {
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
	downloading := testImage(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateInProgress},
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

// onImage puts the volume on backing image img.
func onImage(v *v1beta1.Volume) { v.Spec.BackingImage = "img" }

// imageCondition gives the volume the BackingImageReady condition a verdict gives.
func imageCondition(bi *v1beta1.BackingImage) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		ok, reason, msg := BackingImageVerdict("img", bi)
		SetCondition(&v.Status.Conditions, VolumeConditionBackingImageReady, ok, reason, msg, metav1.NewTime(dstest.Now))
	}
}

// The BackingImageReady condition of a detached volume on img: set from
// the image, warned about once when the image fails, and written only
// when it changes.
func TestVolumeBackingImageCondition(t *testing.T) {
	readyImage := testImage(map[string]v1beta1.BackingImageState{"uuid-node-1": v1beta1.BackingImageStateReady})
	volumeObjects := func(bi *v1beta1.BackingImage, mut ...func(*v1beta1.Volume)) []runtime.Object {
		objs := []runtime.Object{schedNode("node-1"), schedNode("node-2"), schedNode("node-3"),
			vcVolume(append([]func(*v1beta1.Volume){withinSnapshotLimits, onImage}, mut...)...), vcEngine()}
		if bi != nil {
			objs = append(objs, bi)
		}
		return append(objs, threeReplicas()...)
	}
	conditionIs := func(status metav1.ConditionStatus, reason, msg string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) {
			v, err := env.Strata.StrataV1beta1().Volumes(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
			require.NoError(t, err)
			c := meta.FindStatusCondition(v.Status.Conditions, VolumeConditionBackingImageReady)
			require.NotNil(t, c, "the BackingImageReady condition")
			assert.Equal(t, status, c.Status)
			assert.Equal(t, reason, c.Reason)
			assert.Equal(t, msg, c.Message)
			assert.Equal(t, v1beta1.VolumeRobustnessHealthy, v.Status.Robustness, "the replicas lost nothing")
		}
	}
	runSyncCases(t, []syncCase{
		{
			name:       "the image failed: the condition names it and its failure, with a warning",
			objects:    volumeObjects(failedImage()),
			wantWrites: []string{"update volumes/status v1"},
			wantEvents: []string{"Warning BackingImageFailed"},
			check: conditionIs(metav1.ConditionFalse, BackingImageReadyReasonFailed,
				"backing image img failed: disk uuid-node-1: "+badSumMsg),
		},
		{
			name:    "the failure already reported: nothing to write, no second warning",
			objects: volumeObjects(failedImage(), imageCondition(failedImage())),
		},
		{
			name:       "the image is gone",
			objects:    volumeObjects(nil),
			wantWrites: []string{"update volumes/status v1"},
			wantEvents: []string{"Warning BackingImageFailed"},
			check:      conditionIs(metav1.ConditionFalse, BackingImageReadyReasonMissing, "backing image img does not exist"),
		},
		{
			name:       "the image became ready: the condition clears, no warning",
			objects:    volumeObjects(readyImage, imageCondition(failedImage())),
			wantWrites: []string{"update volumes/status v1"},
			check:      conditionIs(metav1.ConditionTrue, BackingImageReadyReasonReady, "backing image img has a ready copy"),
		},
		{
			name:    "ready and reported: nothing to write",
			objects: volumeObjects(readyImage, imageCondition(readyImage)),
		},
		{
			name: "a volume without an image has no such condition",
			objects: []runtime.Object{schedNode("node-1"), schedNode("node-2"), schedNode("node-3"),
				vcVolume(withinSnapshotLimits), vcEngine(), vcReplica("r1", "node-1"), vcReplica("r2", "node-2"),
				vcReplica("r3", "node-3")},
		},
	}, volumeSyncer)
}

// A ticket of a volume whose image failed says so, naming the image and
// the failure, instead of "the volume is attaching".
func TestTicketStatusesOnBackingImage(t *testing.T) {
	now := metav1.NewTime(dstest.Now)
	va := &v1beta1.VolumeAttachment{Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: tickets(
		ticket("pod", csi, "node-1"))}}
	attaching := func(mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
		return vcVolume(append([]func(*v1beta1.Volume){onImage, func(v *v1beta1.Volume) {
			v.Spec.NodeID, v.Status.State = "node-1", v1beta1.VolumeStateAttaching
		}}, mut...)...)
	}
	downloading := testImage(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateInProgress})
	tests := []struct {
		name                string
		vol                 *v1beta1.Volume
		wantReason, wantMsg string
	}{
		{"the image failed", attaching(imageCondition(failedImage())), TicketReasonBackingImageFailed,
			"the volume cannot attach: backing image img failed: disk uuid-node-1: " + badSumMsg},
		{"the image is gone", attaching(imageCondition(nil)), TicketReasonBackingImageFailed,
			"the volume cannot attach: backing image img does not exist"},
		{"the image is being fetched", attaching(imageCondition(downloading)), TicketReasonWaitingToAttach,
			"the volume is attaching; backing image img has no ready copy yet"},
		{"the image is ready", attaching(imageCondition(testImage(map[string]v1beta1.BackingImageState{"d1": v1beta1.BackingImageStateReady}))),
			TicketReasonWaitingToAttach, "the volume is attaching"},
		{"the image failed but the volume is faulted too: the image is the cause",
			attaching(imageCondition(failedImage()), func(v *v1beta1.Volume) { v.Status.Robustness = v1beta1.VolumeRobustnessFaulted }),
			TicketReasonBackingImageFailed, "the volume cannot attach: backing image img failed: disk uuid-node-1: " + badSumMsg},
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

// A replica on an image that failed says so rather than "pending: waiting
// for the first copy", and asks for no copy on its disk (a spec write
// would retry the failed fetch).
func TestReplicaWaitsOnBackingImage(t *testing.T) {
	pendingHere := func(bi *v1beta1.BackingImage) {
		bi.Spec.DiskFileSpecMap["uuid-node-2"] = &v1beta1.BackingImageDiskFileSpec{}
		bi.Status.DiskFileStatusMap["uuid-node-2"] = &v1beta1.BackingImageDiskFileStatus{State: v1beta1.BackingImageStatePending,
			Message: "waiting for the first copy, on disk uuid-node-1"}
	}
	inProgress := testImage(map[string]v1beta1.BackingImageState{"uuid-node-1": v1beta1.BackingImageStateInProgress})
	inProgress.Status.FirstCopyDisk = "uuid-node-1"
	tests := []struct {
		name                string
		bi                  *v1beta1.BackingImage
		wantWrites          []string
		wantReason, wantMsg string
	}{
		{name: "failed, the copy here waiting for the first", bi: func() *v1beta1.BackingImage {
			bi := failedImage()
			pendingHere(bi)
			return bi
		}(), wantReason: reasonBackingImageFailed, wantMsg: "backing image img failed: disk uuid-node-1: " + badSumMsg},
		{name: "failed, no copy asked for here: none is", bi: failedImage(), wantReason: reasonBackingImageFailed,
			wantMsg: "backing image img failed: disk uuid-node-1: " + badSumMsg},
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
			c, err := NewReplicaController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-2", "", newFakeConnector(nil), nil)
			require.NoError(t, err)
			env.ClearActions()
			r := vcReplica("r2", "node-2", onReplicaImage)
			file, err := c.backingFile(context.Background(), r)
			require.NoError(t, err)
			assert.Empty(t, file)
			assert.Equal(t, tc.wantWrites, writes(env.Strata.Actions()), "API writes")
			cond := meta.FindStatusCondition(r.Status.Conditions, ReplicaConditionWaitingForBackingImage)
			require.NotNil(t, cond)
			assert.Equal(t, metav1.ConditionTrue, cond.Status)
			assert.Equal(t, tc.wantReason, cond.Reason)
			assert.Equal(t, tc.wantMsg, cond.Message)
		})
	}
}

func onReplicaImage(r *v1beta1.Replica) { r.Spec.BackingImage = "img" }

// The volume controller hears of a backing image only when the verdict
// for its volumes changes, and then enqueues exactly the volumes on it.
func TestVolumeEnqueueOnBackingImage(t *testing.T) {
	const inProgress = v1beta1.BackingImageStateInProgress
	onNamed := func(name, image string) *v1beta1.Volume {
		return vcVolume(func(v *v1beta1.Volume) { v.Name, v.UID, v.Spec.BackingImage = name, k8stypes.UID(name), image })
	}
	named := func(name string) func(*v1beta1.BackingImage) {
		return func(bi *v1beta1.BackingImage) { bi.Name, bi.UID = name, k8stypes.UID(name) }
	}
	env := dstest.New(t, []runtime.Object{onNamed("v1", "img"), onNamed("v2", "img2"), onNamed("v3", ""), onNamed("vm", "marker"),
		testImage(map[string]v1beta1.BackingImageState{"d1": inProgress}),
		testImage(map[string]v1beta1.BackingImageState{"d1": inProgress}, named("img2"))}, nil)
	c, err := NewVolumeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
	require.NoError(t, err)
	images := env.Strata.StrataV1beta1().BackingImages(testNS)
	ctx := context.Background()
	// drainThrough drains the queue until marker came out: the informer
	// hands a handler its events in order, so whatever an earlier event
	// enqueued is in by then (a negative proven without a sleep).
	drainThrough := func(markers ...string) []string {
		t.Helper()
		var keys []string
		require.Eventually(t, func() bool {
			for c.Queue.Len() > 0 {
				k, _ := c.Queue.Get()
				c.Queue.Done(k)
				keys = append(keys, k)
			}
			for _, m := range markers {
				if !slices.Contains(keys, testNS+"/"+m) {
					return false
				}
			}
			return true
		}, 5*time.Second, 10*time.Millisecond, "%v enqueued", markers)
		slices.Sort(keys)
		return keys
	}
	setCopy := func(name string, state v1beta1.BackingImageState, progress int32) {
		t.Helper()
		bi, err := images.Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		bi.Status.DiskFileStatusMap["d1"].State, bi.Status.DiskFileStatusMap["d1"].Progress = state, progress
		_, err = images.UpdateStatus(ctx, bi, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	// Past both informers' replay: a new image enqueues its volumes, a new
	// volume itself.
	_, err = images.Create(ctx, testImage(nil, named("marker")), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = env.Strata.StrataV1beta1().Volumes(testNS).Create(ctx, onNamed("v4", ""), metav1.CreateOptions{})
	require.NoError(t, err)
	drainThrough("vm", "v4")

	setCopy("img", inProgress, 50)
	setCopy("img2", v1beta1.BackingImageStateFailed, 0)
	assert.Equal(t, []string{testNS + "/v2"}, drainThrough("v2"), "progress enqueues nothing; a failure its volumes")
	setCopy("img", v1beta1.BackingImageStateReady, 100)
	assert.Equal(t, []string{testNS + "/v1"}, drainThrough("v1"), "ready: the volumes on the image")
	require.NoError(t, images.Delete(ctx, "img2", metav1.DeleteOptions{}))
	assert.Equal(t, []string{testNS + "/v2"}, drainThrough("v2"), "gone: the volumes on the image")
}

// The status write that follows a replica's start can meet a conflict; the
// retry finds the instance running and must still clear the condition (CI
// once saw a replica wait for good on an image it was already running on).
func TestRunningReplicaNoLongerWaits(t *testing.T) {
	r := vcReplica("r2", "node-2", onReplicaImage)
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

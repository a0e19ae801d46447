package volume

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

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/controller/kit/kittest"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The BackingImageReady condition of a detached volume on img: set from
// the image, warned about once when the image fails, and written only
// when it changes.
func TestVolumeBackingImageCondition(t *testing.T) {
	readyImage := fixture.Image(map[string]v1beta1.BackingImageState{"uuid-node-1": v1beta1.BackingImageStateReady})
	volumeObjects := func(bi *v1beta1.BackingImage, mut ...func(*v1beta1.Volume)) []runtime.Object {
		objs := []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3"),
			fixture.Volume(append([]func(*v1beta1.Volume){fixture.WithinSnapshotLimits, fixture.OnImage}, mut...)...), fixture.Engine()}
		if bi != nil {
			objs = append(objs, bi)
		}
		return append(objs, fixture.ThreeReplicas()...)
	}
	conditionIs := func(status metav1.ConditionStatus, reason, msg string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) {
			v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
			require.NoError(t, err)
			c := meta.FindStatusCondition(v.Status.Conditions, kit.VolumeConditionBackingImageReady)
			require.NotNil(t, c, "the BackingImageReady condition")
			assert.Equal(t, status, c.Status)
			assert.Equal(t, reason, c.Reason)
			assert.Equal(t, msg, c.Message)
			assert.Equal(t, v1beta1.VolumeRobustnessHealthy, v.Status.Robustness, "the replicas lost nothing")
		}
	}
	fixture.RunSyncCases(t, []fixture.SyncCase{
		{
			Name:       "the image failed: the condition names it and its failure, with a warning",
			Objects:    volumeObjects(fixture.FailedImage()),
			WantWrites: []string{"update volumes/status v1"},
			WantEvents: []string{"Warning BackingImageFailed"},
			Check: conditionIs(metav1.ConditionFalse, kit.BackingImageReadyReasonFailed,
				"backing image img failed: disk uuid-node-1: "+fixture.BadSumMsg),
		},
		{
			Name:    "the failure already reported: nothing to write, no second warning",
			Objects: volumeObjects(fixture.FailedImage(), kittest.ImageCondition(fixture.FailedImage())),
		},
		{
			Name:       "the image is gone",
			Objects:    volumeObjects(nil),
			WantWrites: []string{"update volumes/status v1"},
			WantEvents: []string{"Warning BackingImageFailed"},
			Check:      conditionIs(metav1.ConditionFalse, kit.BackingImageReadyReasonMissing, "backing image img does not exist"),
		},
		{
			Name:       "the image became ready: the condition clears, no warning",
			Objects:    volumeObjects(readyImage, kittest.ImageCondition(fixture.FailedImage())),
			WantWrites: []string{"update volumes/status v1"},
			Check:      conditionIs(metav1.ConditionTrue, kit.BackingImageReadyReasonReady, "backing image img has a ready copy"),
		},
		{
			Name:    "ready and reported: nothing to write",
			Objects: volumeObjects(readyImage, kittest.ImageCondition(readyImage)),
		},
		{
			Name: "a volume without an image has no such condition",
			Objects: []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3"),
				fixture.Volume(fixture.WithinSnapshotLimits), fixture.Engine(), fixture.Replica("r1", "node-1"), fixture.Replica("r2", "node-2"),
				fixture.Replica("r3", "node-3")},
		},
	}, volumeSyncer)
}

// The volume controller hears of a backing image only when the verdict
// for its volumes changes, and then enqueues exactly the volumes on it.
func TestVolumeEnqueueOnBackingImage(t *testing.T) {
	const inProgress = v1beta1.BackingImageStateInProgress
	onNamed := func(name, image string) *v1beta1.Volume {
		return fixture.Volume(func(v *v1beta1.Volume) { v.Name, v.UID, v.Spec.BackingImage = name, k8stypes.UID(name), image })
	}
	named := func(name string) func(*v1beta1.BackingImage) {
		return func(bi *v1beta1.BackingImage) { bi.Name, bi.UID = name, k8stypes.UID(name) }
	}
	env := dstest.New(t, []runtime.Object{onNamed("v1", "img"), onNamed("v2", "img2"), onNamed("v3", ""), onNamed("vm", "marker"),
		fixture.Image(map[string]v1beta1.BackingImageState{"d1": inProgress}),
		fixture.Image(map[string]v1beta1.BackingImageState{"d1": inProgress}, named("img2"))}, nil)
	c, err := NewVolumeController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
	require.NoError(t, err)
	images := env.Strata.StrataV1beta1().BackingImages(fixture.NS)
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
				if !slices.Contains(keys, fixture.NS+"/"+m) {
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
	_, err = images.Create(ctx, fixture.Image(nil, named("marker")), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = env.Strata.StrataV1beta1().Volumes(fixture.NS).Create(ctx, onNamed("v4", ""), metav1.CreateOptions{})
	require.NoError(t, err)
	drainThrough("vm", "v4")

	setCopy("img", inProgress, 50)
	setCopy("img2", v1beta1.BackingImageStateFailed, 0)
	assert.Equal(t, []string{fixture.NS + "/v2"}, drainThrough("v2"), "progress enqueues nothing; a failure its volumes")
	setCopy("img", v1beta1.BackingImageStateReady, 100)
	assert.Equal(t, []string{fixture.NS + "/v1"}, drainThrough("v1"), "ready: the volumes on the image")
	require.NoError(t, images.Delete(ctx, "img2", metav1.DeleteOptions{}))
	assert.Equal(t, []string{fixture.NS + "/v2"}, drainThrough("v2"), "gone: the volumes on the image")
}

package backingimage

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/imagefile"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// untouchedBody fails the test if an upload reads it: a refused upload is
// refused before its body.
type untouchedBody struct{ reads atomic.Int32 }

func (b *untouchedBody) Read([]byte) (int, error) {
	b.reads.Add(1)
	return 0, io.EOF
}

type uploadResult struct {
	res imagefile.Result
	err error
}

// One upload per image at a time: while an upload's body is still
// arriving, a second upload of the image, to the same manager or to
// another, is refused with a conflict at once, its body unread. When the
// first one fails (the client went away), its copy is recorded failed and
// the next upload is taken; when that one ends, the image holds its data.
func TestBackingImageUploadOneAtATime(t *testing.T) {
	dir := t.TempDir()
	node := fixture.ReadyDiskNode("node-1")
	node.Spec.Disks["disk-1"] = v1beta1.DiskSpec{Path: dir, AllowScheduling: true}
	image := fixture.Image(nil, func(bi *v1beta1.BackingImage) {
		bi.Spec.SourceType, bi.Spec.SourceParameters = v1beta1.BackingImageSourceTypeUpload, nil
		bi.Status.Checksum = ""
	})
	env := dstest.New(t, []runtime.Object{node, fixture.ReadyDiskNode("node-2"), cleanupWait("60"), image},
		[]runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)})
	c, err := NewBackingImageController(logrus.New(), env.DS, record.NewFakeRecorder(100), "node-1", fixture.NewFakeConnector(nil), 1<<20, nil)
	require.NoError(t, err)
	peer, err := NewBackingImageController(logrus.New(), env.DS, record.NewFakeRecorder(100), "node-2", fixture.NewFakeConnector(nil), 1<<20, nil)
	require.NoError(t, err)
	ctx := context.Background()
	k := fileJobKey{"uid-img", "uuid-node-1"}
	img := bytes.Repeat([]byte("strata"), 10<<10)

	// The first upload sends half its bytes, then waits.
	pr, pw := io.Pipe()
	first := make(chan uploadResult, 1)
	go func() {
		res, err := c.Upload(ctx, "img", pr, int64(len(img)))
		first <- uploadResult{res, err}
	}()
	_, err = pw.Write(img[:len(img)/2])
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		b, err := env.DS.BackingImages.GetRO("img")
		st := b.Status.DiskFileStatusMap["uuid-node-1"]
		return err == nil && st != nil && st.State == v1beta1.BackingImageStateInProgress && st.Message == jobUploading
	}, 5*time.Second, 5*time.Millisecond, "the first upload's claim is in the cache")
	job, running := c.files.get(k)
	require.True(t, running)
	assert.Equal(t, jobUploading, job.kind)

	tests := []struct {
		name    string
		to      *BackingImageController
		wantMsg string
	}{
		{name: "to the same manager", to: c, wantMsg: "an upload of backing image img is already in progress on node node-1"},
		{name: "to another manager", to: peer, wantMsg: "an upload of backing image img is already in progress on node node-1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := &untouchedBody{}
			start := time.Now()
			_, err := tc.to.Upload(ctx, "img", body, int64(len(img)))
			require.ErrorIs(t, err, types.ErrImageConflict)
			assert.Contains(t, err.Error(), tc.wantMsg)
			assert.Less(t, time.Since(start), time.Second, "refused at once")
			assert.Zero(t, body.reads.Load(), "the second upload's body is not read")
		})
	}
	select {
	case r := <-first:
		t.Fatalf("the first upload ended while its body was open: %v", r.err)
	default:
	}
	assert.Equal(t, "uuid-node-1", imageSpec(t, env).Status.FirstCopyDisk, "the second upload took nothing from the first")

	// The client goes away: the upload fails, its copy is recorded failed
	// (retried by the next upload, nothing left in the disk).
	pw.CloseWithError(errors.New("client went away"))
	var r uploadResult
	select {
	case r = <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the first upload did not end with its body")
	}
	require.ErrorContains(t, r.err, "client went away")
	assert.False(t, c.files.uploading("uid-img"), "no upload is marked once it ended")
	require.NoError(t, c.Sync(ctx, fixture.NS+"/img"))
	st := imageSpec(t, env).Status.DiskFileStatusMap["uuid-node-1"]
	require.NotNil(t, st)
	assert.Equal(t, v1beta1.BackingImageStateFailed, st.State)
	assert.Contains(t, st.Message, "receiving the upload: reading the upload after")
	assert.NoFileExists(t, filepath.Join(kit.BackingImageDir(dir, "img", "abcd1234"), backingSourcePart))
	require.Eventually(t, func() bool {
		b, err := env.DS.BackingImages.GetRO("img")
		return err == nil && b.Status.DiskFileStatusMap["uuid-node-1"].State == v1beta1.BackingImageStateFailed
	}, 5*time.Second, 5*time.Millisecond)

	// The upload sent again is taken and completes.
	res, err := c.Upload(ctx, "img", bytes.NewReader(img), int64(len(img)))
	require.NoError(t, err)
	assert.Equal(t, sha512Of(string(img)), res.Checksum)
	_, err = os.Stat(filepath.Join(kit.BackingImageDir(dir, "img", "abcd1234"), kit.BackingFileName))
	require.NoError(t, err)
	require.NoError(t, c.Sync(ctx, fixture.NS+"/img"))
	bi := imageSpec(t, env)
	assert.Equal(t, v1beta1.BackingImageStateReady, bi.Status.DiskFileStatusMap["uuid-node-1"].State)
	assert.Equal(t, sha512Of(string(img)), bi.Status.Checksum)
}

// A claim is only as good as its node: the first-copy disk of a node whose
// manager is down, or an upload that ended, holds no upload back.
func TestBackingImageUploadElsewhere(t *testing.T) {
	claimed := func(state v1beta1.BackingImageState, msg string) *v1beta1.BackingImage {
		return fixture.Image(nil, func(bi *v1beta1.BackingImage) {
			bi.Spec.SourceType, bi.Spec.SourceParameters = v1beta1.BackingImageSourceTypeUpload, nil
			bi.Spec.DiskFileSpecMap["uuid-node-1"] = &v1beta1.BackingImageDiskFileSpec{}
			bi.Status.FirstCopyDisk = "uuid-node-1"
			bi.Status.DiskFileStatusMap["uuid-node-1"] = &v1beta1.BackingImageDiskFileStatus{State: state, Message: msg}
		})
	}
	tests := []struct {
		name         string
		image        *v1beta1.BackingImage
		node1Renewed time.Duration // ago
		wantConflict bool
	}{
		{name: "receiving on a live node", image: claimed(v1beta1.BackingImageStateInProgress, jobUploading), wantConflict: true},
		{name: "receiving on a node whose manager is down", image: claimed(v1beta1.BackingImageStateInProgress, jobUploading),
			node1Renewed: time.Hour},
		{name: "the upload failed", image: claimed(v1beta1.BackingImageStateFailed, "receiving the upload: reading the upload after 5 bytes")},
		{name: "waiting for the upload to be sent again", image: claimed(v1beta1.BackingImageStatePending, "waiting for the upload to be sent again")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{fixture.ReadyDiskNode("node-1"), fixture.ReadyDiskNode("node-2"), tc.image},
				[]runtime.Object{fixture.Lease("node-1", tc.node1Renewed), fixture.Lease("node-2", 0)})
			c, err := NewBackingImageController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-2", fixture.NewFakeConnector(nil), 1<<20, nil)
			require.NoError(t, err)
			bi, err := env.DS.BackingImages.GetRO("img")
			require.NoError(t, err)
			err = c.uploadElsewhere(bi)
			if tc.wantConflict {
				require.ErrorIs(t, err, types.ErrImageConflict)
				assert.Contains(t, err.Error(), "in progress on node node-1")
				return
			}
			assert.NoError(t, err)
		})
	}
}

package backingimage

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func unusedSince(ago time.Duration, disks ...string) func(*v1beta1.BackingImage) {
	return func(bi *v1beta1.BackingImage) {
		for _, d := range disks {
			bi.Status.DiskLastRefAtMap[d] = dstest.Now.Add(-ago).Format(time.RFC3339)
		}
	}
}

func cleanupWait(minutes string) *v1beta1.Setting {
	return &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingBackingImageCleanupWaitInterval), Namespace: fixture.NS},
		Value: minutes}
}

// imageUser is a replica of a volume on img, on the given disk.
func imageUser(name, disk string) *v1beta1.Replica {
	return fixture.ReplicaCR(name, "/data", func(r *v1beta1.Replica) { r.Spec.BackingImage, r.Spec.DiskID = "img", disk })
}

func imageObjects(objs ...runtime.Object) []runtime.Object {
	return append([]runtime.Object{fixture.ReadyDiskNode("node-1"), fixture.ReadyDiskNode("node-2"), fixture.Node("node-3", nil, fixture.ReadyTrue()), cleanupWait("1")}, objs...)
}

func buildBackingImageController(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
	c, err := NewBackingImageController(logrus.New(), env.DS, rec, me, dp, 1<<30, nil)
	if err != nil {
		return nil, err
	}
	return c.Sync, nil
}

func errConflict() error {
	return apierrors.NewConflict(v1beta1.Resource("backingimages"), "img", errors.New("stale"))
}

func sha512Of(s string) string {
	sum := sha512.Sum512([]byte(s))
	return hex.EncodeToString(sum[:])
}

func imageSpec(t *testing.T, env *dstest.Env) *v1beta1.BackingImage {
	t.Helper()
	bi, err := env.Strata.StrataV1beta1().BackingImages(fixture.NS).Get(context.Background(), "img", metav1.GetOptions{})
	require.NoError(t, err)
	return bi
}

func TestBackingImageOwnerDecisions(t *testing.T) {
	const ready, failed = v1beta1.BackingImageStateReady, v1beta1.BackingImageStateFailed
	n1, n2 := "uuid-node-1", "uuid-node-2"
	fixture.RunSyncCases(t, []fixture.SyncCase{
		{
			Name:       "a new image gets the finalizer first",
			Objects:    imageObjects(fixture.Image(nil, func(bi *v1beta1.BackingImage) { bi.Finalizers = nil })),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages img"},
		},
		{
			Name:       "an image nobody asked a copy of is fetched onto the owner's disk",
			Objects:    imageObjects(fixture.Image(nil, func(bi *v1beta1.BackingImage) { bi.Status.OwnerID = "node-1" })),
			Me:         "node-1",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages img"},
			WantEvents: []string{"Normal DiskRequested"},
			Check: func(t *testing.T, env *dstest.Env) {
				assert.Contains(t, imageSpec(t, env).Spec.DiskFileSpecMap, n1)
			},
		},
		{
			Name:       "the first-copy disk is chosen among the wanted disks of alive nodes",
			Objects:    imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n2: v1beta1.BackingImageStatePending})),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages/status img"},
			WantEvents: []string{"Normal FirstCopyDisk"},
			Check: func(t *testing.T, env *dstest.Env) {
				bi := imageSpec(t, env)
				assert.Equal(t, n2, bi.Status.FirstCopyDisk)
				assert.Equal(t, "0/1", bi.Status.Copies)
			},
		},
		{
			Name: "a copy unused for longer than the interval is taken out of the spec",
			Objects: imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready, n2: ready},
				unusedSince(2*time.Minute, n2)), imageUser("r1", n1)),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages img"},
			WantEvents: []string{"Normal CopyCleanedUp"},
			Check: func(t *testing.T, env *dstest.Env) {
				assert.NotContains(t, imageSpec(t, env).Spec.DiskFileSpecMap, n2)
				assert.Contains(t, imageSpec(t, env).Spec.DiskFileSpecMap, n1)
			},
		},
		{
			Name: "before the interval the unused copy stays",
			Objects: imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready, n2: ready},
				unusedSince(30*time.Second, n2), func(bi *v1beta1.BackingImage) { bi.Status.Copies = "2/2" }), imageUser("r1", n1)),
			Me:  "node-3",
			Key: fixture.NS + "/img",
		},
		{
			Name: "never below minNumberOfCopies",
			Objects: imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready, n2: ready},
				unusedSince(time.Hour, n1, n2), func(bi *v1beta1.BackingImage) {
					bi.Spec.MinNumberOfCopies, bi.Status.Copies = 1, "2/2"
				})),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages img"},
			WantEvents: []string{"Normal CopyCleanedUp"},
			Check: func(t *testing.T, env *dstest.Env) {
				assert.Len(t, imageSpec(t, env).Spec.DiskFileSpecMap, 1, "the older copy goes, one stays")
			},
		},
		{
			Name: "the last ready copy stays while another disk copies from it",
			Objects: imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready, n2: v1beta1.BackingImageStateInProgress},
				unusedSince(time.Hour, n1), func(bi *v1beta1.BackingImage) { bi.Status.Copies = "1/2" }), imageUser("r2", n2)),
			Me:  "node-3",
			Key: fixture.NS + "/img",
		},
		{
			Name: "a used copy loses its last-use time",
			Objects: imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready},
				unusedSince(time.Hour, n1), func(bi *v1beta1.BackingImage) { bi.Status.Copies = "1/1" }), imageUser("r1", n1)),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages/status img"},
			Check: func(t *testing.T, env *dstest.Env) {
				assert.Empty(t, imageSpec(t, env).Status.DiskLastRefAtMap)
			},
		},
		{
			Name: "a copy on a node whose manager is down is unknown, and the first failure is shown",
			Objects: imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready, n2: failed},
				func(bi *v1beta1.BackingImage) { bi.Status.DiskFileStatusMap[n2].Message = "checksum mismatch" }),
				imageUser("r1", n1), imageUser("r2", n2)),
			Kube:       []runtime.Object{fixture.Lease("node-1", time.Hour), fixture.Lease("node-2", 0), fixture.Lease("node-3", 0)},
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages/status img"},
			// No ready copy can be reached: the failed disk fetches from the source.
			WantEvents: []string{"Normal FirstCopyDisk"},
			Check: func(t *testing.T, env *dstest.Env) {
				bi := imageSpec(t, env)
				assert.Equal(t, n2, bi.Status.FirstCopyDisk)
				assert.Equal(t, v1beta1.BackingImageStateUnknown, bi.Status.DiskFileStatusMap[n1].State)
				assert.Equal(t, "node node-1 is down", bi.Status.DiskFileStatusMap[n1].Message)
				assert.Equal(t, n2+": checksum mismatch", bi.Status.Message)
				assert.Equal(t, "0/2", bi.Status.Copies)
			},
		},
		{
			Name: "a deleted image loses its finalizer once no copy is left",
			Objects: imageObjects(fixture.Image(nil, func(bi *v1beta1.BackingImage) {
				now := metav1.NewTime(dstest.Now)
				bi.DeletionTimestamp, bi.Status.Copies = &now, "0/0"
			})),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			WantWrites: []string{"update backingimages img"},
		},
		{
			Name:       "a spec write conflict is returned for a retry",
			Objects:    imageObjects(fixture.Image(map[string]v1beta1.BackingImageState{n1: ready, n2: ready}, unusedSince(time.Hour, n2)), imageUser("r1", n1)),
			Me:         "node-3",
			Key:        fixture.NS + "/img",
			APIErr:     &fixture.ReactorError{Verb: "update", Resource: "backingimages", Err: errConflict()},
			WantErr:    "stale",
			WantWrites: []string{"update backingimages img"},
		},
	}, buildBackingImageController)
}

// The copies on this manager's own disks: an unwanted copy turns
// terminating first, then its directory goes with its entry; a copy whose
// file is there but not yet checked by this process is verified before it is
// trusted, and a wrong file is removed and fetched again.
func TestBackingImageLocalCopies(t *testing.T) {
	dir := t.TempDir()
	node := fixture.ReadyDiskNode("node-1")
	node.Spec.Disks["disk-1"] = v1beta1.DiskSpec{Path: dir, AllowScheduling: true}
	copyDir := kit.BackingImageDir(dir, "img", "abcd1234")
	require.NoError(t, os.MkdirAll(copyDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(copyDir, "backing"), []byte("not the image"), 0o644))
	n1 := "uuid-node-1"

	env := dstest.New(t, []runtime.Object{node, fixture.ReadyDiskNode("node-2"), cleanupWait("60"),
		fixture.Image(map[string]v1beta1.BackingImageState{n1: v1beta1.BackingImageStateReady},
			func(bi *v1beta1.BackingImage) {
				bi.Status.OwnerID = "node-2"
				bi.Status.Checksum = sha512Of("the image")
			})},
		[]runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)})
	rec := record.NewFakeRecorder(20)
	c, err := NewBackingImageController(logrus.New(), env.DS, rec, "node-1", fixture.NewFakeConnector(nil), 1<<30, nil)
	require.NoError(t, err)
	key := fixture.NS + "/img"
	waitCache := func(cond func(*v1beta1.BackingImage) bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			b, err := env.DS.BackingImages.GetRO("img")
			return err == nil && cond(b)
		}, 5*time.Second, 5*time.Millisecond)
	}

	// Found but not checked by this process: verified in the background,
	// still reported ready meanwhile; the mismatch fails it and removes it.
	require.NoError(t, c.Sync(context.Background(), key))
	require.Eventually(t, func() bool { j, ok := c.files.get(fileJobKey{"uid-img", n1}); return ok && j.done }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, c.Sync(context.Background(), key))
	bi := imageSpec(t, env)
	st := bi.Status.DiskFileStatusMap[n1]
	assert.Equal(t, v1beta1.BackingImageStateFailed, st.State)
	assert.Contains(t, st.Message, "checksum mismatch")
	assert.Contains(t, st.Message, sha512Of("the image"))
	assert.Equal(t, int32(1), st.Attempts)
	assert.NoFileExists(t, filepath.Join(copyDir, "backing"), "a wrong copy is removed")

	// Taken out of the spec: terminating, then gone.
	bi.Spec.DiskFileSpecMap = nil
	_, err = env.Strata.StrataV1beta1().BackingImages(fixture.NS).Update(context.Background(), bi, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitCache(func(b *v1beta1.BackingImage) bool { return len(b.Spec.DiskFileSpecMap) == 0 })
	require.NoError(t, c.Sync(context.Background(), key))
	assert.Equal(t, v1beta1.BackingImageStateTerminating, imageSpec(t, env).Status.DiskFileStatusMap[n1].State)
	assert.DirExists(t, copyDir)
	waitCache(func(b *v1beta1.BackingImage) bool {
		st := b.Status.DiskFileStatusMap[n1]
		return st != nil && st.State == v1beta1.BackingImageStateTerminating
	})
	require.NoError(t, c.Sync(context.Background(), key))
	assert.NotContains(t, imageSpec(t, env).Status.DiskFileStatusMap, n1)
	assert.NoDirExists(t, copyDir)
}

// Uploads: refused for another source type, past the size limit (said up
// front or found while reading, leaving no file), and a second time once a
// copy holds the data; accepted otherwise, onto this node's disk, which
// becomes the first copy.
func TestBackingImageUpload(t *testing.T) {
	dir := t.TempDir()
	node := fixture.ReadyDiskNode("node-1")
	node.Spec.Disks["disk-1"] = v1beta1.DiskSpec{Path: dir, AllowScheduling: true}
	upload := func(bi *v1beta1.BackingImage) {
		bi.Spec.SourceType, bi.Spec.SourceParameters = v1beta1.BackingImageSourceTypeUpload, nil
	}
	img := make([]byte, 64<<10)
	copy(img, "strata")
	tests := []struct {
		name    string
		image   *v1beta1.BackingImage
		size    int64 // Content-Length; -1 unknown
		wantErr error
	}{
		{name: "a download image takes no upload", image: fixture.Image(nil), size: int64(len(img)), wantErr: types.ErrImageConflict},
		{name: "larger than the limit, said up front", image: fixture.Image(nil, upload), size: 1 << 20, wantErr: types.ErrImageTooLarge},
		{name: "larger than the limit, found while reading", image: fixture.Image(nil, upload), size: -1, wantErr: types.ErrImageTooLarge},
		{name: "data already there", image: fixture.Image(map[string]v1beta1.BackingImageState{"uuid-node-2": v1beta1.BackingImageStateReady}, upload),
			size: int64(len(img)), wantErr: types.ErrImageConflict},
		{name: "accepted", image: fixture.Image(nil, upload), size: int64(len(img))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{node.DeepCopy(), fixture.ReadyDiskNode("node-2"), cleanupWait("60"), tc.image},
				[]runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)})
			c, err := NewBackingImageController(logrus.New(), env.DS, record.NewFakeRecorder(20), "node-1", fixture.NewFakeConnector(nil), 32<<10, nil)
			require.NoError(t, err)
			if tc.wantErr == nil {
				c.uploadLimit = 1 << 20
			}
			res, err := c.Upload(context.Background(), "img", bytes.NewReader(img), tc.size)
			file := filepath.Join(kit.BackingImageDir(dir, "img", "abcd1234"), "backing")
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				assert.NoFileExists(t, file)
				assert.NoFileExists(t, filepath.Join(filepath.Dir(file), "source.part"))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, int64(len(img)), res.VirtualSize)
			assert.Equal(t, sha512Of(string(img)), res.Checksum)
			assert.FileExists(t, file)
			bi := imageSpec(t, env)
			assert.Contains(t, bi.Spec.DiskFileSpecMap, "uuid-node-1")
			assert.Equal(t, "uuid-node-1", bi.Status.FirstCopyDisk)
		})
	}
}

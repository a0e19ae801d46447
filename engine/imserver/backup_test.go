package imserver

import (
	"context"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/internal/devtools/s3server"
)

const backupVolSize = 8 * mib

// newVolume starts an engine over n new replicas, on backing (a file) if
// not empty, and returns it; the engine is <name>-e.
func (im *testIM) newVolume(t *testing.T, name string, size int64, n int, backing string) *replication.Engine {
	t.Helper()
	replicas := map[string]string{}
	for i := range n {
		rn := name + "-r" + string(rune('0'+i))
		req := replicaReq(rn, im.replicaDir(rn), size)
		req.BackingFile = backing
		r, err := im.c.InstanceCreate(context.Background(), req)
		require.NoError(t, err)
		replicas[rn] = r.Address
	}
	_, err := im.c.InstanceCreate(context.Background(), engineReq(name+"-e", size, replicas))
	require.NoError(t, err)
	return im.engine(t, name+"-e")
}

func writeRandom(t *testing.T, eng *replication.Engine, rng *rand.Rand, off int64, n int) {
	t.Helper()
	p := make([]byte, n)
	rng.Read(p)
	_, err := eng.WriteAt(p, off)
	require.NoError(t, err)
}

func fileTarget(dir string) engineapi.BackupTarget {
	return engineapi.BackupTarget{URL: "file://" + dir}
}

func ended(state string) bool {
	return state == engineapi.JobStateCompleted || state == engineapi.JobStateError
}

// backupAndWait runs a backup and returns its final status.
func (im *testIM) backupAndWait(t *testing.T, w *watcher, args engineapi.SnapshotBackupArgs) *engineapi.BackupStatus {
	t.Helper()
	require.NoError(t, im.c.SnapshotBackup(context.Background(), args))
	inst := w.until(t, args.Engine, "backup "+args.Backup+" ended", 30*time.Second, func(i *impb.Instance) bool {
		st := i.BackupStatus[args.Backup]
		return st != nil && ended(st.State)
	})
	return engineapi.InstanceFromWire(inst).BackupStatus[args.Backup]
}

// restoreAndWait restores into a new volume and returns the final status.
func (im *testIM) restoreAndWait(t *testing.T, w *watcher, args engineapi.BackupRestoreArgs) *engineapi.RestoreStatus {
	t.Helper()
	require.NoError(t, im.c.BackupRestore(context.Background(), args))
	inst := w.until(t, args.Engine, "restore ended", 30*time.Second, func(i *impb.Instance) bool {
		return i.RestoreStatus != nil && ended(i.RestoreStatus.State)
	})
	return engineapi.InstanceFromWire(inst).RestoreStatus
}

// A full backup of s1, an incremental of s2 on it that reads only the
// chunks written since s1 (not the head's later writes), both restored into
// new volumes that read byte for byte as s1 and s2; then a flipped byte in
// a pack fails a restore naming the chunk.
func TestBackupIncrementalAndRestore(t *testing.T) {
	ctx := context.Background()
	im := newTestIM(t, Options{})
	w := im.watch(t)
	dir := t.TempDir()
	target := fileTarget(dir)
	rng := rand.New(rand.NewSource(7))

	src := im.newVolume(t, "src", backupVolSize, 2, "")
	writeRandom(t, src, rng, 0, 3*mib)         // chunks 0-2
	writeRandom(t, src, rng, 5*mib+4096, 8192) // chunk 5
	_, err := im.c.SnapshotCreate(ctx, "src-e", "s1", true, nil, 0)
	require.NoError(t, err)
	want1 := readAt(t, src, 0, backupVolSize)

	args := engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s1", Backup: "b1", Volume: "vol", Target: target,
		Labels: map[string]string{"k": "v"}}
	st := im.backupAndWait(t, w, args)
	require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)
	assert.Equal(t, int64(4), st.ReadChunks, "only the chunks s1's layers hold are read")
	assert.Equal(t, int64(4), st.DataChunks)
	assert.Empty(t, st.BaseBackup)
	assert.Equal(t, int32(100), st.Progress)
	assert.Equal(t, "s1", st.Snapshot)
	// The same backup again is a no-op: the manager retries.
	require.NoError(t, im.c.SnapshotBackup(ctx, args))

	writeRandom(t, src, rng, 1*mib+512<<10, 4096) // chunk 1
	writeRandom(t, src, rng, 7*mib, 64<<10)       // chunk 7
	_, err = im.c.SnapshotCreate(ctx, "src-e", "s2", true, nil, 0)
	require.NoError(t, err)
	want2 := readAt(t, src, 0, backupVolSize)
	writeRandom(t, src, rng, 0, 8*mib) // the head: not part of s2

	st = im.backupAndWait(t, w, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s2", Backup: "b2",
		Volume: "vol", Target: target, BaseBackup: "b1", BaseSnapshot: "s1"})
	require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)
	assert.Equal(t, "b1", st.BaseBackup)
	assert.Equal(t, int64(2), st.ReadChunks, "the incremental reads only the two chunks written since s1")
	assert.Equal(t, int64(2), st.NewChunks)
	assert.Equal(t, int64(5), st.DataChunks)

	for _, tc := range []struct {
		backup string
		want   []byte
	}{{"b1", want1}, {"b2", want2}} {
		dst := im.newVolume(t, "restore-"+tc.backup, backupVolSize, 2, "")
		rs := im.restoreAndWait(t, w, engineapi.BackupRestoreArgs{Engine: "restore-" + tc.backup + "-e",
			Backup: tc.backup, Volume: "vol", Target: target})
		require.Equal(t, engineapi.JobStateCompleted, rs.State, rs.Error)
		assert.Equal(t, int32(100), rs.Progress)
		assert.True(t, equalBytes(tc.want, readAt(t, dst, 0, backupVolSize)), "restore of %s reads as its snapshot", tc.backup)
		for _, r := range dst.Replicas() {
			assert.Equal(t, replication.ModeRW, r.Mode, "every replica took the restore")
		}
	}

	// A damaged pack: the restore fails naming the chunk and stays failed.
	packs, err := filepath.Glob(filepath.Join(dir, "packs", "*", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, packs)
	for _, p := range packs {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		data[100] ^= 0xff // inside the first chunk's bytes
		require.NoError(t, os.WriteFile(p, data, 0o644))
	}
	im.newVolume(t, "bad", backupVolSize, 1, "")
	rs := im.restoreAndWait(t, w, engineapi.BackupRestoreArgs{Engine: "bad-e", Backup: "b1", Volume: "vol", Target: target})
	assert.Equal(t, engineapi.JobStateError, rs.State)
	assert.Contains(t, rs.Error, "backup b1 of volume vol: chunk ")
	assert.Contains(t, rs.Error, " in pack ", "the chunk's pack is named (the cause is a checksum or zstd CRC mismatch)")
	got, err := im.c.InstanceGet(ctx, "bad-e")
	require.NoError(t, err)
	assert.Equal(t, engineapi.JobStateError, got.RestoreStatus.GetState(), "the failure stays in the status")
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// A base whose snapshot is gone from the chain gives a full backup that
// says so; a second job on a busy engine is refused.
func TestBackupFallsBackToFullAndRefusesBusy(t *testing.T) {
	ctx := context.Background()
	im := newTestIM(t, Options{})
	w := im.watch(t)
	target := fileTarget(t.TempDir())
	rng := rand.New(rand.NewSource(3))
	src := im.newVolume(t, "src", backupVolSize, 1, "")
	writeRandom(t, src, rng, 0, mib)
	_, err := im.c.SnapshotCreate(ctx, "src-e", "s1", true, nil, 0)
	require.NoError(t, err)
	st := im.backupAndWait(t, w, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s1", Backup: "b1", Volume: "vol", Target: target})
	require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)
	writeRandom(t, src, rng, 2*mib, mib)
	_, err = im.c.SnapshotCreate(ctx, "src-e", "s2", true, nil, 0)
	require.NoError(t, err)
	require.NoError(t, im.c.SnapshotRemove(ctx, "src-e", "s1"))
	require.NoError(t, im.c.SnapshotPurge(ctx, "src-e"))
	require.Eventually(t, func() bool {
		snaps, err := im.c.SnapshotList(ctx, "src-e")
		return err == nil && snaps["s1"] == nil
	}, 10*time.Second, 20*time.Millisecond, "s1 purged")

	st = im.backupAndWait(t, w, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s2", Backup: "b2", Volume: "vol",
		Target: target, BaseBackup: "b1", BaseSnapshot: "s1"})
	require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)
	assert.Empty(t, st.BaseBackup)
	assert.Contains(t, st.Message, "full backup")
	assert.Equal(t, int64(2), st.DataChunks)

	// A backup running on the engine: another one, or a restore, is refused.
	eng := im.engine(t, "src-e")
	im.s.jobs.mu.Lock()
	running := &backupJob{backup: "b3", snapshot: "s2"}
	running.cancel, running.state = func() {}, engineapi.JobStateInProgress
	im.s.jobs.backups[eng] = running
	im.s.jobs.mu.Unlock()
	err = im.c.SnapshotBackup(ctx, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s2", Backup: "b4", Volume: "vol", Target: target})
	assert.ErrorIs(t, err, engineapi.ErrBusy)
	assert.NoError(t, im.c.SnapshotBackup(ctx, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s2", Backup: "b3",
		Volume: "vol", Target: target}), "the running backup again is a no-op")

	err = im.c.SnapshotBackup(ctx, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "nope", Backup: "b5", Volume: "vol", Target: target})
	assert.ErrorIs(t, err, engineapi.ErrNotFound)
	err = im.c.SnapshotBackup(ctx, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s2", Backup: "b5", Volume: "vol",
		Target: engineapi.BackupTarget{URL: "ftp://x"}})
	assert.ErrorIs(t, err, engineapi.ErrInvalid)
}

// A volume on a backing image: the image's bytes are recorded as backing
// chunks, not uploaded, and a restore onto a copy of the same image reads
// as the snapshot.
func TestBackupOnBackingImage(t *testing.T) {
	ctx := context.Background()
	im := newTestIM(t, Options{})
	w := im.watch(t)
	dir := t.TempDir()
	target := fileTarget(dir)
	image := filepath.Join(dir, "image.raw")
	img, _ := writeImage(t, image, 1)
	imageCopy := filepath.Join(t.TempDir(), "image-copy.raw")
	require.NoError(t, os.WriteFile(imageCopy, img, 0o644))

	src := im.newVolume(t, "src", backedSize, 2, image)
	_, err := src.WriteAt(pattern(0xa1, 4096), 512<<10) // chunk 0, over the image
	require.NoError(t, err)
	_, err = src.WriteAt(pattern(0xa2, 8192), 3*mib) // chunk 3, past it
	require.NoError(t, err)
	_, err = im.c.SnapshotCreate(ctx, "src-e", "s1", true, nil, 0)
	require.NoError(t, err)
	want := readAt(t, src, 0, backedSize)

	args := engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s1", Backup: "b1", Volume: "vol", Target: target}
	err = im.c.SnapshotBackup(ctx, args)
	require.ErrorIs(t, err, engineapi.ErrInvalid, "a volume on a backing file needs the image's name")
	args.BackingImage = &engineapi.BackingImageRef{Name: "img", Checksum: "abc"}
	st := im.backupAndWait(t, w, args)
	require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)
	assert.Equal(t, int64(2), st.ReadChunks, "chunk 0 (written over the image) and chunk 3")
	assert.Equal(t, int64(2), st.DataChunks)
	assert.Equal(t, int64(1), st.BackingChunks, "chunk 1 holds only the image's tail")

	store, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tg, err := backupstore.Open(ctx, store, backupstore.Options{})
	require.NoError(t, err)
	m, err := tg.LoadManifest(ctx, "vol", "b1")
	require.NoError(t, err)
	require.NotNil(t, m.BackingImage)
	assert.Equal(t, "img", m.BackingImage.Name)
	kinds := map[int64]backupstore.EntryKind{}
	for _, e := range m.Entries {
		kinds[e.Index] = e.Kind
	}
	assert.Equal(t, map[int64]backupstore.EntryKind{0: backupstore.KindData, 1: backupstore.KindBacking, 3: backupstore.KindData}, kinds)

	dst := im.newVolume(t, "dst", backedSize, 2, imageCopy)
	rs := im.restoreAndWait(t, w, engineapi.BackupRestoreArgs{Engine: "dst-e", Backup: "b1", Volume: "vol", Target: target, Backing: true})
	require.Equal(t, engineapi.JobStateCompleted, rs.State, rs.Error)
	assert.True(t, equalBytes(want, readAt(t, dst, 0, backedSize)), "the restore over the image reads as s1")

	// Without the image the restore fails, naming it.
	im.newVolume(t, "plain", backedSize, 1, "")
	rs = im.restoreAndWait(t, w, engineapi.BackupRestoreArgs{Engine: "plain-e", Backup: "b1", Volume: "vol", Target: target})
	assert.Equal(t, engineapi.JobStateError, rs.State)
	assert.Contains(t, rs.Error, "backing image img")
}

// The same round trip through a real S3 server (versitygw on loopback).
func TestBackupRestoreS3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts versitygw")
	}
	ctx := context.Background()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	bin, err := s3server.Binary(ctx, root)
	require.NoError(t, err)
	srv, err := s3server.Start(bin, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	s3, err := backupstore.NewS3Store(backupstore.S3Config{Endpoint: srv.Endpoint, Bucket: "backups", Region: "us-east-1",
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	require.NoError(t, err)
	require.NoError(t, s3.MakeBucket(ctx))
	target := engineapi.BackupTarget{URL: "s3://backups@us-east-1/cluster-a", S3Endpoint: srv.Endpoint,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}

	im := newTestIM(t, Options{})
	w := im.watch(t)
	rng := rand.New(rand.NewSource(9))
	src := im.newVolume(t, "src", backupVolSize, 1, "")
	writeRandom(t, src, rng, mib/2, 2*mib)
	_, err = im.c.SnapshotCreate(ctx, "src-e", "s1", true, nil, 0)
	require.NoError(t, err)
	want := readAt(t, src, 0, backupVolSize)
	st := im.backupAndWait(t, w, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s1", Backup: "b1", Volume: "vol", Target: target})
	require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)

	dst := im.newVolume(t, "dst", backupVolSize, 1, "")
	rs := im.restoreAndWait(t, w, engineapi.BackupRestoreArgs{Engine: "dst-e", Backup: "b1", Volume: "vol", Target: target})
	require.Equal(t, engineapi.JobStateCompleted, rs.State, rs.Error)
	assert.True(t, equalBytes(want, readAt(t, dst, 0, backupVolSize)))

	bad := target
	bad.SecretKey = "wrong"
	st = im.backupAndWait(t, w, engineapi.SnapshotBackupArgs{Engine: "src-e", Snapshot: "s1", Backup: "b2", Volume: "vol", Target: bad})
	assert.Equal(t, engineapi.JobStateError, st.State)
	assert.True(t, strings.Contains(st.Error, "b2"), st.Error)
}

// A backup reads the replica this instance manager serves, in process,
// whatever its name sorts as; an engine whose replicas all live elsewhere
// is read over a data connection. Both backups restore to the snapshot's
// bytes.
func TestBackupReadsItsOwnReplicaInProcess(t *testing.T) {
	ctx := context.Background()
	im, other := newTestIM(t, Options{}), newTestIM(t, Options{})
	w := im.watch(t)
	target := fileTarget(t.TempDir())
	rng := rand.New(rand.NewSource(11))
	replicaOn := func(at *testIM, name string) string {
		r, err := at.c.InstanceCreate(ctx, replicaReq(name, at.replicaDir(name), backupVolSize))
		require.NoError(t, err)
		return r.Address
	}
	volumes := []struct {
		engine      string
		replicas    map[string]string
		wantReplica string
	}{
		{"near-e", map[string]string{"a-far": replicaOn(other, "a-far"), "z-near": replicaOn(im, "z-near")}, "z-near"},
		{"far-e", map[string]string{"far-r": replicaOn(other, "far-r")}, "far-r"},
	}
	for _, v := range volumes {
		_, err := im.c.InstanceCreate(ctx, engineReq(v.engine, backupVolSize, v.replicas))
		require.NoError(t, err)
		eng := im.engine(t, v.engine)
		writeRandom(t, eng, rng, 0, 2*mib)
		writeRandom(t, eng, rng, 6*mib+4096, 8192)
		_, err = im.c.SnapshotCreate(ctx, v.engine, "s1", true, nil, 0)
		require.NoError(t, err)
		want := readAt(t, eng, 0, backupVolSize)

		st := im.backupAndWait(t, w, engineapi.SnapshotBackupArgs{Engine: v.engine, Snapshot: "s1", Backup: v.engine + "-b",
			Volume: v.engine, Target: target})
		require.Equal(t, engineapi.JobStateCompleted, st.State, st.Error)
		assert.Equal(t, v.wantReplica, st.Replica, "%s: the replica read", v.engine)

		dst := im.newVolume(t, "restore-"+v.engine, backupVolSize, 1, "")
		rs := im.restoreAndWait(t, w, engineapi.BackupRestoreArgs{Engine: "restore-" + v.engine + "-e",
			Backup: v.engine + "-b", Volume: v.engine, Target: target})
		require.Equal(t, engineapi.JobStateCompleted, rs.State, rs.Error)
		assert.True(t, equalBytes(want, readAt(t, dst, 0, backupVolSize)), "%s: the restore reads as s1", v.engine)
	}
}

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/attachment"
	backupctl "github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/internal/devtools/s3server"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// nbdSum is `nbdcopy <endpoint> - | sha256sum` of a served volume.
func nbdSum(t *testing.T, endpoint string) string {
	t.Helper()
	out, err := exec.Command("bash", "-c", "set -o pipefail; nbdcopy '"+endpoint+"' - | sha256sum").CombinedOutput()
	require.NoError(t, err, "nbdcopy %s: %s", endpoint, out)
	return strings.Fields(string(out))[0]
}

// defaultS3Target points the default backup target at a fresh prefix of a
// real S3 server and returns the target as the backupstore library sees it.
func defaultS3Target(t *testing.T, prefix string) (*backupstore.Target, *backupstore.CountingStore) {
	t.Helper()
	_, tgt, counting := defaultS3TargetOn(t, prefix)
	return tgt, counting
}

// defaultS3TargetOn is defaultS3Target with the server, to stop or damage.
func defaultS3TargetOn(t *testing.T, prefix string) (*s3server.Server, *backupstore.Target, *backupstore.CountingStore) {
	t.Helper()
	srv := startS3(t)
	tgt, counting := pointDefaultTarget(t, srv, srv.Endpoint, prefix)
	return srv, tgt, counting
}

// throttledS3Target is defaultS3TargetOn with the managers reaching the
// server through a proxy limited to bytesPerSecond, so that a fault lands in
// the middle of a transfer of a few tens of MiB; the test itself reads the
// target at full speed. SetRate(0) lifts the limit.
func throttledS3Target(t *testing.T, prefix string, bytesPerSecond int) (*s3server.Server, *s3server.Throttle, *backupstore.Target) {
	t.Helper()
	srv := startS3(t)
	th, err := s3server.NewThrottle(srv, bytesPerSecond)
	require.NoError(t, err)
	t.Cleanup(func() { _ = th.Close() })
	tgt, _ := pointDefaultTarget(t, srv, th.Endpoint, prefix)
	return srv, th, tgt
}

// pointDefaultTarget makes the default target prefix on srv, reached by the
// managers at endpoint, and opens it for the test at srv's own endpoint.
func pointDefaultTarget(t *testing.T, srv *s3server.Server, endpoint, prefix string) (*backupstore.Target, *backupstore.CountingStore) {
	t.Helper()
	s3Target(t, backupctl.DefaultBackupTargetName, "s3://backups@us-east-1/"+prefix, map[string]string{
		backupstore.SecretEndpoint: endpoint, backupstore.SecretAccessKey: srv.AccessKey,
		backupstore.SecretSecretKey: srv.SecretKey})
	waitTarget(t, backupctl.DefaultBackupTargetName, true, "listed")
	store, err := backupstore.NewS3Store(s3Config(srv, prefix))
	require.NoError(t, err)
	counting := backupstore.NewCountingStore(store)
	tgt, err := backupstore.Open(context.Background(), counting, backupstore.Options{})
	require.NoError(t, err)
	return tgt, counting
}

// storedObjects counts the objects and bytes under the target's prefix.
func storedObjects(t *testing.T, store backupstore.ObjectStore) (int, int64) {
	t.Helper()
	objs, err := store.List(context.Background(), "")
	require.NoError(t, err)
	var bytes int64
	for _, o := range objs {
		bytes += o.Size
	}
	return len(objs), bytes
}

// restoreVolume creates a volume filled from a backup.
func restoreVolume(t *testing.T, name, size, backup string, mut ...func(*v1beta1.Volume)) {
	t.Helper()
	createVolume(t, name, size, 2, append([]func(*v1beta1.Volume){func(v *v1beta1.Volume) { v.Spec.FromBackup = backup }}, mut...)...)
}

// waitRestored waits for a restore to complete, failing at once if it fails.
func waitRestored(t *testing.T, name string) *v1beta1.Volume {
	t.Helper()
	return waitVolume(t, name, 3*time.Minute, "restored", func(v *v1beta1.Volume) bool {
		rs := v.Status.RestoreStatus
		require.False(t, rs != nil && rs.State == v1beta1.VolumeRestoreStateFailed, "restore of %s failed: %+v", name, rs)
		return rs != nil && rs.State == v1beta1.VolumeRestoreStateCompleted
	})
}

// attachAndSum attaches a volume for the admin on node-1 and returns the
// sha256sum of what it serves.
func attachAndSum(t *testing.T, name string) string {
	t.Helper()
	updateTickets(t, name, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	// A volume just restored is still attached there for the restore, with
	// no frontend, until the admin's ticket takes over.
	v := waitVolume(t, name, 2*time.Minute, "served on node-1", servedOn("node-1"))
	return nbdSum(t, v.Status.FrontendEndpoint)
}

// Write, snapshot, back up, write more, back up again: the second backup
// uploads only what changed (counted on the S3 server); each backup
// restores into a new volume that serves nothing before the restore is
// complete and then reads exactly as the source did at that snapshot.
func testRestoreBackupsIntoNewVolumes(t *testing.T) {
	ctx := context.Background()
	tgt, counting := defaultS3Target(t, "e2e-restore")
	const vol = "e2e-rs-src"
	createVolume(t, vol, "64Mi", 2)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, time.Minute, "attached to node-1", attachedTo("node-1"))
	// Random, so neither compression nor deduplication hides what travels.
	random := filepath.Join(t.TempDir(), "random.raw")
	runCmd(t, "dd", "if=/dev/urandom", "of="+random, "bs=1M", "count=40", "status=none")
	runCmd(t, "nbdcopy", random, v.Status.FrontendEndpoint)
	createSnapshot(t, vol, "e2e-rs-s1")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	sum1 := nbdSum(t, v.Status.FrontendEndpoint)

	objs0, bytes0 := storedObjects(t, counting)
	createBackup(t, "e2e-rs-b1", "e2e-rs-s1", "")
	waitBackupCompleted(t, "e2e-rs-b1")
	objs1, bytes1 := storedObjects(t, counting)

	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0xe1 2M 1M", "write -P 0xe2 3M 1M", "write -P 0xe3 50M 1M")
	createSnapshot(t, vol, "e2e-rs-s2")
	waitSnapshotsReady(t, vol, 2, time.Minute)
	sum2 := nbdSum(t, v.Status.FrontendEndpoint)
	require.NotEqual(t, sum1, sum2)
	createBackup(t, "e2e-rs-b2", "e2e-rs-s2", "")
	waitBackupCompleted(t, "e2e-rs-b2")
	objs2, bytes2 := storedObjects(t, counting)
	t.Logf("b1 added %d objects, %d bytes; b2 added %d objects, %d bytes", objs1-objs0, bytes1-bytes0, objs2-objs1, bytes2-bytes1)
	m2, err := tgt.LoadManifest(ctx, vol, "e2e-rs-b2")
	require.NoError(t, err)
	assert.Equal(t, int64(3), m2.Stats.NewChunks, "b2 uploads the 3 changed chunks only")
	assert.Less(t, bytes2-bytes1, (bytes1-bytes0)/10, "b2 stores a fraction of b1's bytes")
	assert.Greater(t, bytes1-bytes0, int64(40<<20), "b1 stores the random 40 MiB")

	restoreVolume(t, "e2e-rs-r1", "64Mi", "e2e-rs-b1")
	// A workload's ticket (asking for the frontend) waits for the restore;
	// the volume serves nothing until it is complete.
	updateTickets(t, "e2e-rs-r1", func(m map[string]*v1beta1.AttachmentTicket) {
		m["admin"] = &v1beta1.AttachmentTicket{ID: "admin", Type: v1beta1.AttacherTypeStrataAPI, NodeID: "node-1",
			Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.FalseValue}}
	})
	// Until the restore is completed (read in the same Volume object) the
	// volume has no frontend. A small restore may end before a poll sees
	// the ticket waiting, so that sighting is logged, not required (the
	// gate itself is table-tested in the controller).
	sawWaiting := false
	require.Eventually(t, func() bool {
		if st := getVA(t, "e2e-rs-r1").Status.AttachmentTicketStatuses["admin"]; st != nil &&
			slices.ContainsFunc(st.Conditions, func(c metav1.Condition) bool {
				return c.Reason == attachment.TicketReasonWaitingForRestore
			}) {
			sawWaiting = true
		}
		v := getVolume(t, "e2e-rs-r1")
		done := v.Status.RestoreStatus != nil && v.Status.RestoreStatus.State == v1beta1.VolumeRestoreStateCompleted
		require.True(t, done || v.Status.FrontendEndpoint == "", "a volume being restored serves no data")
		return done
	}, 3*time.Minute, 100*time.Millisecond, "the restore completes")
	t.Logf("the admin ticket was seen waiting for the restore: %t", sawWaiting)
	r1 := waitRestored(t, "e2e-rs-r1")
	assert.Equal(t, "e2e-rs-b1", r1.Status.RestoreStatus.Backup)
	assert.Equal(t, int32(100), r1.Status.RestoreStatus.Progress)
	r1 = waitVolume(t, "e2e-rs-r1", 2*time.Minute, "attached for the admin after the restore", attachedTo("node-1"))
	require.Eventually(t, func() bool { return getVolume(t, "e2e-rs-r1").Status.FrontendEndpoint != "" },
		time.Minute, 200*time.Millisecond, "the frontend starts once restored")
	assert.Equal(t, sum1, nbdSum(t, getVolume(t, "e2e-rs-r1").Status.FrontendEndpoint), "r1 reads as the source at s1")
	assert.NotContains(t, getVA(t, "e2e-rs-r1").Spec.AttachmentTickets, "restore-e2e-rs-r1", "the restore ticket is released")
	assertEvent(t, "e2e-rs-r1", backupctl.EventReasonRestoreCompleted, "restored backup e2e-rs-b1")

	restoreVolume(t, "e2e-rs-r2", "128Mi", "e2e-rs-b2")
	// The admin's ticket comes before the restore's goes and leaves
	// disableFrontend unset, which asks for the frontend: once restored,
	// the volume is served for it, not left frontend-less.
	got := attachAndSum(t, "e2e-rs-r2")
	waitRestored(t, "e2e-rs-r2")
	// r2 is larger: its first 64 MiB are s2, the rest zeros.
	assert.Equal(t, sum2, headSum(t, getVolume(t, "e2e-rs-r2").Status.FrontendEndpoint, 64<<20), "r2 reads as the source at s2")
	assert.NotEqual(t, sum2, got, "the whole 128 MiB differs from the 64 MiB source")
	assert.Regexp(t, `e2e-rs-r2\s.*completed\s+100`, kubectl(t, "-n", ns, "get", "vol", "e2e-rs-r2", "-o", "wide"))
}

// headSum is the SHA-256 of the first n bytes a volume serves.
func headSum(t *testing.T, endpoint string, n int64) string {
	t.Helper()
	b := readVolume(t, endpoint, n)
	for _, c := range b[n:] {
		require.Zero(t, c, "the volume reads zeros past %d", n)
	}
	sum := sha256.Sum256(b[:n])
	return hex.EncodeToString(sum[:])
}

// A backup of a volume on a backing image stores none of the image's
// chunks; restoring it onto the image, or onto another copy of the same
// image under another name, gives the volume's data.
func testRestoreOntoBackingImage(t *testing.T) {
	ctx := context.Background()
	tgt, _ := defaultS3Target(t, "e2e-restore-bi")
	srv := startImageServer(t)
	rawPath, sum := rawTestImage(t, srv.dir, "rs.raw", 16<<20)
	createBackingImage(t, "e2e-rs-img", downloadSpec(srv.url+"/rs.raw", sum))
	waitBackingImage(t, "e2e-rs-img", 2*time.Minute, "first copy ready", allCopiesReady(1))

	const vol = "e2e-rs-bi"
	createVolume(t, vol, "32Mi", 2, func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-rs-img" })
	waitVolume(t, vol, 2*time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, 2*time.Minute, "attached to node-1", attachedTo("node-1"))
	// Over part of the image (chunk 1) and past it (chunk 20).
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x42 1M 512k", "write -P 0x43 20M 1M")
	createSnapshot(t, vol, "e2e-rs-bi-s1")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	want := nbdSum(t, v.Status.FrontendEndpoint)
	createBackup(t, "e2e-rs-bi-b1", "e2e-rs-bi-s1", "")
	b := waitBackupCompleted(t, "e2e-rs-bi-b1")
	assert.Equal(t, "e2e-rs-img", b.Status.VolumeBackingImageName)
	assert.Equal(t, sum, b.Status.VolumeBackingImageChecksum)

	// None of the image's chunks is on the target.
	raw, err := os.ReadFile(rawPath)
	require.NoError(t, err)
	stored := map[backupstore.ChunkID]bool{}
	m, err := tgt.LoadManifest(ctx, vol, "e2e-rs-bi-b1")
	require.NoError(t, err)
	for _, e := range m.Entries {
		if e.Kind == backupstore.KindData {
			stored[e.Chunk] = true
		}
	}
	assert.Positive(t, m.Stats.BackingChunks, "chunks left to the image")
	for off := 0; off < len(raw); off += 1 << 20 {
		assert.False(t, stored[backupstore.ChunkID(sha256.Sum256(raw[off:off+1<<20]))], "image chunk at %d is not stored", off)
	}

	// Onto the image the backup names (spec.backingImage filled in).
	restoreVolume(t, "e2e-rs-bi-r1", "32Mi", "e2e-rs-bi-b1")
	assert.Equal(t, "e2e-rs-img", getVolume(t, "e2e-rs-bi-r1").Spec.BackingImage, "the backup's image is taken")
	waitRestored(t, "e2e-rs-bi-r1")
	assert.Equal(t, want, attachAndSum(t, "e2e-rs-bi-r1"))

	// Onto another copy of the same image, under another name.
	createBackingImage(t, "e2e-rs-img-copy", downloadSpec(srv.url+"/rs.raw", sum))
	waitBackingImage(t, "e2e-rs-img-copy", 2*time.Minute, "first copy ready", allCopiesReady(1))
	restoreVolume(t, "e2e-rs-bi-r2", "32Mi", "e2e-rs-bi-b1", func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-rs-img-copy" })
	waitRestored(t, "e2e-rs-bi-r2")
	assert.Equal(t, want, attachAndSum(t, "e2e-rs-bi-r2"))
}

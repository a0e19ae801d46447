package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/internal/devtools/s3server"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// writeRandom writes mib MiB of random data at the start of a served volume.
func writeRandom(t *testing.T, endpoint string, mib int) {
	t.Helper()
	random := filepath.Join(t.TempDir(), "random.raw")
	runCmd(t, "dd", "if=/dev/urandom", "of="+random, "bs=1M", "count="+strconv.Itoa(mib), "status=none")
	runCmd(t, "nbdcopy", random, endpoint)
}

// waitBackupRunning waits until a backup uploads (status InProgress).
func waitBackupRunning(t *testing.T, name string) {
	t.Helper()
	var b *v1beta1.Backup
	require.Eventually(t, func() bool {
		var err error
		b, err = env.adminStrata.StrataV1beta1().Backups(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && b.Status.State == v1beta1.BackupStateInProgress && b.Status.Progress > 0
	}, 2*time.Minute, 20*time.Millisecond, "backup %s uploads", name)
	t.Logf("backup %s is uploading (%d%%): the fault comes now", name, b.Status.Progress)
}

// waitBackupEnded waits for a backup to complete or fail and returns it.
func waitBackupEnded(t *testing.T, name string) *v1beta1.Backup {
	t.Helper()
	var b *v1beta1.Backup
	require.Eventually(t, func() bool {
		var err error
		b, err = env.adminStrata.StrataV1beta1().Backups(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && (b.Status.State == v1beta1.BackupStateCompleted || b.Status.State == v1beta1.BackupStateError)
	}, 5*time.Minute, 200*time.Millisecond, "backup %s ends", name)
	return b
}

// assertBackupEndedRight: a completed backup restores to want; a failed
// one is not listed on the target.
func assertBackupEndedRight(t *testing.T, tgt *backupstore.Target, volume, name, want string) {
	t.Helper()
	b := waitBackupEnded(t, name)
	logEnd(t, b)
	if b.Status.State == v1beta1.BackupStateError {
		t.Logf("backup %s failed: %s", name, b.Status.Error)
		infos, err := tgt.ListBackups(context.Background())
		require.NoError(t, err)
		for _, i := range infos {
			assert.NotEqual(t, name, i.Backup, "a failed backup is not listed as complete")
		}
		return
	}
	m, err := tgt.LoadManifest(context.Background(), volume, name)
	require.NoError(t, err)
	assert.Equal(t, want, restoredSum(t, tgt, m), "backup %s restores the snapshot's data", name)
}

// waitRestoring waits until a restore fetches data (progress above 0).
func waitRestoring(t *testing.T, name string) *v1beta1.Volume {
	t.Helper()
	return waitVolume(t, name, 2*time.Minute, "restoring", func(v *v1beta1.Volume) bool {
		rs := v.Status.RestoreStatus
		return rs != nil && rs.State == v1beta1.VolumeRestoreStateRestoring && rs.Progress > 0
	})
}

// logEnd says how a backup that went through a fault ended.
func logEnd(t *testing.T, b *v1beta1.Backup) {
	t.Logf("backup %s ended %s: %s", b.Name, b.Status.State, b.Status.Error)
}

func killAndRestartManager(t *testing.T, node string) {
	t.Helper()
	mgr := env.managers[node]
	require.NoError(t, mgr.Kill())
	restarted, err := mgr.Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[node] = restarted
}

// Backups and restores survive kill -9 of the manager and of the instance
// manager in their middle, and an S3 server stopped mid-upload: each
// backup ends completed with the right data or failed and unlisted, each
// restore completes with the right data. A flipped byte in a stored pack
// fails a restore naming the backup and the chunk.
func TestBackupAndRestoreFaults(t *testing.T) {
	srv, throttle, tgt := throttledS3Target(t, "e2e-faults", faultRate)
	const vol = "e2e-bf"
	createVolume(t, vol, "64Mi", 1)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, time.Minute, "attached to node-1", attachedTo("node-1"))
	writeRandom(t, v.Status.FrontendEndpoint, faultDataMiB)
	createSnapshot(t, vol, "e2e-bf-s1")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	sum1 := volumeSum(t, v.Status.FrontendEndpoint, faultVolumeSize)
	// Backups and restored volumes outlive their subtest: later ones use them.
	parent := t

	t.Run("manager killed mid-backup", func(t *testing.T) {
		createBackup(parent, "e2e-bf-b1", "e2e-bf-s1", "")
		waitBackupRunning(t, "e2e-bf-b1")
		killAndRestartManager(t, "node-1")
		assertBackupEndedRight(t, tgt, vol, "e2e-bf-b1", sum1)
	})

	// Each later backup has faultDataMiB of new data to upload.
	newSnapshot := func(t *testing.T, snap string, n int) string {
		v := waitVolume(t, vol, 2*time.Minute, "served on node-1", servedOn("node-1"))
		writeRandom(t, v.Status.FrontendEndpoint, faultDataMiB)
		createSnapshot(parent, vol, snap)
		waitSnapshotsReady(t, vol, n, time.Minute)
		return volumeSum(t, v.Status.FrontendEndpoint, faultVolumeSize)
	}

	t.Run("S3 server stopped mid-upload and restarted", func(t *testing.T) {
		sum2 := newSnapshot(t, "e2e-bf-s2", 2)
		createBackup(parent, "e2e-bf-b2", "e2e-bf-s2", "")
		waitBackupRunning(t, "e2e-bf-b2")
		require.NoError(t, srv.Stop())
		time.Sleep(3 * time.Second)
		require.NoError(t, srv.Restart())
		assertBackupEndedRight(t, tgt, vol, "e2e-bf-b2", sum2)
	})

	t.Run("instance manager killed mid-backup", func(t *testing.T) {
		sum3 := newSnapshot(t, "e2e-bf-s3", 3)
		createBackup(parent, "e2e-bf-b3", "e2e-bf-s3", "")
		waitBackupRunning(t, "e2e-bf-b3")
		restart := killIM(t, "node-1")
		restart()
		assertBackupEndedRight(t, tgt, vol, "e2e-bf-b3", sum3)
	})

	t.Run("manager killed mid-restore", func(t *testing.T) {
		restoreVolume(parent, "e2e-bf-r1", "64Mi", "e2e-bf-b1")
		r := waitRestoring(t, "e2e-bf-r1")
		t.Logf("restore of e2e-bf-r1 on %s at %d%%: killing its manager", r.Status.CurrentNodeID, r.Status.RestoreStatus.Progress)
		killAndRestartManager(t, r.Status.CurrentNodeID)
		r = waitRestored(t, "e2e-bf-r1")
		t.Logf("restored after %d attempts", r.Status.RestoreStatus.Attempts)
		assert.Equal(t, sum1, volumeSumAttached(t, "e2e-bf-r1"))
	})

	t.Run("instance manager killed mid-restore", func(t *testing.T) {
		restoreVolume(parent, "e2e-bf-r2", "64Mi", "e2e-bf-b1")
		r := waitRestoring(t, "e2e-bf-r2")
		t.Logf("restore of e2e-bf-r2 on %s at %d%%: killing its instance manager", r.Status.CurrentNodeID, r.Status.RestoreStatus.Progress)
		restart := killIM(t, r.Status.CurrentNodeID)
		restart()
		r = waitRestored(t, "e2e-bf-r2")
		assert.GreaterOrEqual(t, r.Status.RestoreStatus.Attempts, int32(2), "the restore started over")
		assert.Equal(t, sum1, volumeSumAttached(t, "e2e-bf-r2"))
	})

	t.Run("a flipped byte in a stored pack fails the restore naming the chunk", func(t *testing.T) {
		throttle.SetRate(0) // no fault to land here: full speed
		flipPackByte(t, srv, "e2e-faults", tgt, vol, "e2e-bf-b1")
		restoreVolume(parent, "e2e-bf-r3", "64Mi", "e2e-bf-b1")
		r := waitVolume(t, "e2e-bf-r3", 3*time.Minute, "restore failed", func(v *v1beta1.Volume) bool {
			rs := v.Status.RestoreStatus
			require.False(t, rs != nil && rs.State == v1beta1.VolumeRestoreStateCompleted, "a damaged backup restored")
			return rs != nil && rs.State == v1beta1.VolumeRestoreStateFailed
		})
		msg := r.Status.RestoreStatus.Message
		t.Logf("restore failed: %s", msg)
		assert.Contains(t, msg, "backup e2e-bf-b1 of volume e2e-bf: chunk ")
		assert.Contains(t, msg, backupstore.ErrChecksum.Error())
		assert.Empty(t, r.Status.FrontendEndpoint, "a failed restore serves nothing")
	})
}

// A fault lands mid-transfer because the managers reach the S3 server
// through a throttle: faultDataMiB at faultRate takes about 4 s each way,
// where a 2-core machine moves it in well under a second.
const (
	faultDataMiB    = 48
	faultVolumeSize = 64 << 20
	faultRate       = 12 << 20
)

// volumeSumAttached attaches a restored volume with its frontend for the
// admin and returns the SHA-256 of its first 512 MiB.
func volumeSumAttached(t *testing.T, name string) string {
	t.Helper()
	updateTickets(t, name, func(m map[string]*v1beta1.AttachmentTicket) {
		m["admin"] = &v1beta1.AttachmentTicket{ID: "admin", Type: v1beta1.AttacherTypeStrataAPI, NodeID: "node-2",
			Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.FalseValue}}
	})
	v := waitVolume(t, name, 2*time.Minute, "served on node-2", servedOn("node-2"))
	return volumeSum(t, v.Status.FrontendEndpoint, faultVolumeSize)
}

// flipPackByte flips one byte in the middle of the first pack backup
// references, as the server stores it (versitygw's posix backend keeps each
// object as a file under its data directory).
func flipPackByte(t *testing.T, srv *s3server.Server, prefix string, tgt *backupstore.Target, volume, backup string) {
	t.Helper()
	m, err := tgt.LoadManifest(context.Background(), volume, backup)
	require.NoError(t, err)
	require.NotEmpty(t, m.Packs)
	id := m.Packs[0].String()
	path := filepath.Join(srv.Dir, "data", "backups", prefix, "packs", id[:2], id)
	info, err := os.Stat(path)
	require.NoError(t, err, "pack %s of backup %s on the server", id, backup)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	b := make([]byte, 1)
	_, err = f.ReadAt(b, info.Size()/2)
	require.NoError(t, err)
	b[0] ^= 0xff
	_, err = f.WriteAt(b, info.Size()/2)
	require.NoError(t, err)
	t.Logf("flipped the byte at %d of %s (%d bytes)", info.Size()/2, path, info.Size())
}

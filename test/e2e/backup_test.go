package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
)

// createBackup creates a Backup of a snapshot, or (snapshot empty) of the
// whole volume named by the label, deleted when the test ends.
func createBackup(t *testing.T, name, snapshot, volume string) {
	t.Helper()
	ctx := context.Background()
	b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1beta1.BackupSpec{SnapshotName: snapshot}}
	if volume != "" {
		b.Labels = map[string]string{stypes.LabelVolume: volume}
	}
	_, err := env.adminStrata.StrataV1beta1().Backups(ns).Create(ctx, b, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminStrata.StrataV1beta1().Backups(ns).Delete(ctx, name, metav1.DeleteOptions{})
		waitBackupGone(t, name)
	})
}

func waitBackupGone(t *testing.T, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "backup %s is deleted", name)
}

// waitBackupCompleted waits for a backup to complete, failing at once if
// it fails.
func waitBackupCompleted(t *testing.T, name string) *v1beta1.Backup {
	t.Helper()
	var last *v1beta1.Backup
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		b, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = b
			require.NotEqual(t, v1beta1.BackupStateError, b.Status.State, "backup %s failed: %s", name, b.Status.Error)
			if b.Status.State == v1beta1.BackupStateCompleted {
				return b
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last == nil {
		t.Fatalf("backup %s not found", name)
	}
	t.Fatalf("backup %s not completed; last status %+v", name, last.Status)
	return nil
}

// volumeSum is the SHA-256 of a volume's first size bytes, read through NBD.
func volumeSum(t *testing.T, endpoint string, size int64) string {
	t.Helper()
	sum := sha256.Sum256(readVolume(t, endpoint, size)[:size])
	return hex.EncodeToString(sum[:])
}

// restoredSum restores a manifest with backupstore into a local file and
// returns the file's SHA-256.
func restoredSum(t *testing.T, tgt *backupstore.Target, m *backupstore.Manifest) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), m.Backup+".raw")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(m.VolumeSize))
	require.NoError(t, tgt.Restore(context.Background(), m, f, nil, backupstore.RestoreOptions{}))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// assertEvent waits for an event of reason on name whose message holds
// want: the recorder writes events after the status that reports the same
// thing, so a test that reads the status first must wait for the event.
func assertEvent(t *testing.T, name, reason, want string) {
	t.Helper()
	var got string
	assert.Eventually(t, func() bool {
		got = eventMessages(t, name, reason)
		return strings.Contains(got, want)
	}, 30*time.Second, 200*time.Millisecond, "an event %s on %s saying %q", reason, name, want)
	if !strings.Contains(got, want) {
		t.Logf("events %s on %s: %q", reason, name, got)
	}
}

func eventMessages(t *testing.T, name, reason string) string {
	t.Helper()
	list, err := env.adminKube.CoreV1().Events(ns).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
	require.NoError(t, err)
	var msgs []string
	for _, e := range list.Items {
		msgs = append(msgs, e.Message)
	}
	return strings.Join(msgs, "\n")
}

// Backups of snapshots to the default target on a real S3 server: the first
// is full, the second incremental on it (fewer chunks read); each manifest
// restores to exactly what the volume held at its snapshot, and its status
// says what it uploaded and what it is incremental on. A backup of a
// detached volume takes its own snapshot through a backup-controller ticket
// and lets the volume detach again. Deleting a Backup deletes its manifest;
// the BackupVolume goes once the backups and the volume are deleted.
func testBackupIncrementalToS3AndDelete(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t)
	s3Target(t, backup.DefaultBackupTargetName, "s3://backups@us-east-1/e2e-backup", map[string]string{
		backupstore.SecretEndpoint: srv.Endpoint, backupstore.SecretAccessKey: srv.AccessKey,
		backupstore.SecretSecretKey: srv.SecretKey})
	waitTarget(t, backup.DefaultBackupTargetName, true, "listed")
	store, err := backupstore.NewS3Store(s3Config(srv, "e2e-backup"))
	require.NoError(t, err)
	tgt, err := backupstore.Open(ctx, store, backupstore.Options{})
	require.NoError(t, err)

	const vol, size = "e2e-bk", int64(64 << 20)
	createVolume(t, vol, "64Mi", 2)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, time.Minute, "attached to node-1", attachedTo("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x5a 0 24M", "write -P 0x11 40M 4M")
	createSnapshot(t, vol, "e2e-bk-s1")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	sum1 := volumeSum(t, v.Status.FrontendEndpoint, size)

	createBackup(t, "e2e-bk-b1", "e2e-bk-s1", "")
	b1 := waitBackupCompleted(t, "e2e-bk-b1")
	assert.Equal(t, vol, b1.Status.VolumeName)
	assert.Equal(t, size, b1.Status.VolumeSize)
	assert.Equal(t, "e2e-bk-s1", b1.Status.SnapshotName)
	assert.Positive(t, b1.Status.Size)
	assert.Contains(t, b1.Finalizers, stypes.FinalizerName)
	assert.Empty(t, b1.Status.IncrementalOn, "b1 is a full backup")
	assert.Positive(t, b1.Status.UploadedBytes)
	assert.LessOrEqual(t, b1.Status.UploadedBytes, b1.Status.Size)

	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x77 4M 2M")
	createSnapshot(t, vol, "e2e-bk-s2")
	waitSnapshotsReady(t, vol, 2, time.Minute)
	sum2 := volumeSum(t, v.Status.FrontendEndpoint, size)
	require.NotEqual(t, sum1, sum2)

	createBackup(t, "e2e-bk-b2", "e2e-bk-s2", "")
	b2 := waitBackupCompleted(t, "e2e-bk-b2")
	require.Eventually(t, func() bool {
		return strings.Contains(eventMessages(t, "e2e-bk-b2", backup.EventReasonBackupStarted), "incremental on e2e-bk-b1")
	}, 30*time.Second, 200*time.Millisecond, "b2 is taken incremental on b1")
	assert.Regexp(t, `NAME\s+SNAPSHOT\s+STATE\s+PROGRESS\s+SIZE\s+UPLOADED\s+VOLUME\s+AGE\n`+
		`e2e-bk-b2\s+e2e-bk-s2\s+Completed\s+100\s+\d+\s+\d+\s+e2e-bk\s`, kubectl(t, "-n", ns, "get", "bk", "e2e-bk-b2"))
	assert.Regexp(t, `INCREMENTALON[^\n]*\ne2e-bk-b2\s[^\n]*\se2e-bk-b1\s`, kubectl(t, "-n", ns, "get", "bk", "e2e-bk-b2", "-o", "wide"))

	m1, err := tgt.LoadManifest(ctx, vol, "e2e-bk-b1")
	require.NoError(t, err)
	m2, err := tgt.LoadManifest(ctx, vol, "e2e-bk-b2")
	require.NoError(t, err)
	// What b2 did stays in its status: its base, and the bytes it uploaded
	// (the 2 MiB written since s1, not the volume's data).
	assert.Equal(t, "e2e-bk-b1", b2.Status.IncrementalOn)
	assert.Equal(t, "e2e-bk-b1", m2.Base, "the manifest names its base")
	assert.Equal(t, m2.Stats.NewBytes, b2.Status.UploadedBytes)
	assert.Positive(t, b2.Status.UploadedBytes)
	assert.Less(t, b2.Status.UploadedBytes, b2.Status.Size, "an incremental backup uploads less than it holds")
	assert.Equal(t, m2.Stats.StoredBytes, b2.Status.Size)
	t.Logf("b1 read %d chunks, b2 read %d", m1.Stats.ReadChunks, m2.Stats.ReadChunks)
	assert.Less(t, m2.Stats.ReadChunks, m1.Stats.ReadChunks, "b2 reads only what changed since s1")
	assert.Equal(t, sum1, restoredSum(t, tgt, m1), "b1 restores to the volume at s1")
	assert.Equal(t, sum2, restoredSum(t, tgt, m2), "b2 restores to the volume at s2")

	// A detached volume: the backup takes its own snapshot, attaching it
	// through a backup-controller ticket.
	updateTickets(t, vol, removeTicket("admin"))
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	// A watch sees the ticket: the whole backup may take less than a poll.
	w, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + vol})
	require.NoError(t, err)
	defer w.Stop()
	sawTicket := make(chan string, 1)
	go func() {
		for ev := range w.ResultChan() {
			va, ok := ev.Object.(*v1beta1.VolumeAttachment)
			if !ok {
				continue
			}
			if tk := va.Spec.AttachmentTickets["backup-e2e-bk-b3"]; tk != nil && tk.Type == v1beta1.AttacherTypeBackupController {
				sawTicket <- tk.NodeID
				return
			}
		}
	}()
	createBackup(t, "e2e-bk-b3", "", vol)
	b3 := waitBackupCompleted(t, "e2e-bk-b3")
	select {
	case node := <-sawTicket:
		t.Logf("b3's backup-controller ticket asked for %s", node)
	case <-time.After(10 * time.Second):
		t.Fatal("the backup did not attach the volume with a backup-controller ticket")
	}
	assert.Equal(t, "e2e-bk-b3", b3.Status.SnapshotName)
	assert.Equal(t, "e2e-bk-b2", b3.Status.IncrementalOn, "b3 is incremental on the newest backup, b2")
	snap, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(ctx, "e2e-bk-b3", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, snap.TakenForStrata(), "the backup's snapshot is a system snapshot")
	waitVolume(t, vol, time.Minute, "detached again after the backup", isDetached)
	assert.NotContains(t, getVA(t, vol).Spec.AttachmentTickets, "backup-e2e-bk-b3")
	m3, err := tgt.LoadManifest(ctx, vol, "e2e-bk-b3")
	require.NoError(t, err)
	assert.Equal(t, sum2, restoredSum(t, tgt, m3), "b3 holds what the volume held (nothing written since s2)")

	// Deleting b1's CR deletes its manifest; b2 still restores (its chunks
	// stay until a GC, and a GC keeps what b2 references).
	require.NoError(t, env.adminStrata.StrataV1beta1().Backups(ns).Delete(ctx, "e2e-bk-b1", metav1.DeleteOptions{}))
	waitBackupGone(t, "e2e-bk-b1")
	_, err = tgt.LoadManifest(ctx, vol, "e2e-bk-b1")
	require.True(t, errors.Is(err, backupstore.ErrNotFound), "b1's manifest is gone: %v", err)
	m2, err = tgt.LoadManifest(ctx, vol, "e2e-bk-b2")
	require.NoError(t, err)
	assert.Equal(t, sum2, restoredSum(t, tgt, m2))
	b2 = getBackup(t, "e2e-bk-b2")
	assert.Equal(t, "e2e-bk-b1", b2.Status.IncrementalOn, "kept after its base is deleted")
	assert.Equal(t, m2.Stats.NewBytes, b2.Status.UploadedBytes, "kept after the target's polls")

	// The volume's BackupVolume: kept, empty, while the volume exists once
	// its backups are deleted; gone once the volume is deleted too.
	waitBackupVolume(t, vol, "names the last backup", func(bv *v1beta1.BackupVolume) bool {
		return bv.Status.LastBackupName == "e2e-bk-b3"
	})
	for _, b := range []string{"e2e-bk-b2", "e2e-bk-b3"} {
		require.NoError(t, env.adminStrata.StrataV1beta1().Backups(ns).Delete(ctx, b, metav1.DeleteOptions{}))
		waitBackupGone(t, b)
	}
	waitBackupVolume(t, vol, "kept with no last backup while the volume exists", func(bv *v1beta1.BackupVolume) bool {
		return bv.Status.LastBackupName == "" && bv.Status.LastBackupAt == ""
	})
	deleteVolume(t, vol)
	waitBackupVolumeGone(t, vol)
	require.Eventually(t, func() bool {
		return strings.Contains(eventMessages(t, backup.DefaultBackupTargetName, backup.EventReasonBackupVolumeRemoved),
			"removed BackupVolume "+vol)
	}, 30*time.Second, 200*time.Millisecond, "the BackupTarget says it removed the BackupVolume")
}

func getBackup(t *testing.T, name string) *v1beta1.Backup {
	t.Helper()
	b, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return b
}

// waitBackupVolume waits until cond holds for the BackupVolume of volume,
// and says what it looked like last when it does not.
func waitBackupVolume(t *testing.T, volume, what string, cond func(*v1beta1.BackupVolume) bool) {
	t.Helper()
	var last v1beta1.BackupVolumeStatus
	require.Eventually(t, func() bool {
		bv, err := env.adminStrata.StrataV1beta1().BackupVolumes(ns).Get(context.Background(), volume, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = bv.Status
		return cond(bv)
	}, time.Minute, 200*time.Millisecond, "BackupVolume %s %s (last status %+v)", volume, what, &last)
}

func waitBackupVolumeGone(t *testing.T, volume string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().BackupVolumes(ns).Get(context.Background(), volume, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "BackupVolume %s goes with its backups and its volume", volume)
}

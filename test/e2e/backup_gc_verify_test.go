package e2e

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
)

// writeImage writes a volume's whole content through NBD from a local
// image: random bytes in the given [offset, offset+length) ranges, zeros
// elsewhere. It returns the image's SHA-256.
func writeImage(t *testing.T, endpoint string, size int64, ranges ...[2]int64) string {
	t.Helper()
	img := make([]byte, size)
	for _, r := range ranges {
		_, err := rand.Read(img[r[0] : r[0]+r[1]])
		require.NoError(t, err)
	}
	path := filepath.Join(t.TempDir(), "image.raw")
	require.NoError(t, os.WriteFile(path, img, 0o600))
	runCmd(t, "nbdcopy", path, endpoint)
	sum := sha256.Sum256(img)
	return hex.EncodeToString(sum[:])
}

// storedPacks lists the pack keys on the target.
func storedPacks(t *testing.T, store backupstore.ObjectStore) []string {
	t.Helper()
	objs, err := store.List(context.Background(), "packs/")
	require.NoError(t, err)
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
	}
	sort.Strings(keys)
	return keys
}

func packKeys(m *backupstore.Manifest) []string {
	var keys []string
	for _, p := range m.Packs {
		h := p.String()
		keys = append(keys, "packs/"+h[:2]+"/"+h)
	}
	sort.Strings(keys)
	return keys
}

// waitVerified waits for the answer to verify request req.
func waitVerified(t *testing.T, name, req string) *v1beta1.BackupVerification {
	t.Helper()
	var last *v1beta1.BackupVerification
	require.Eventually(t, func() bool {
		b, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || b.Status.Verification == nil {
			return false
		}
		last = b.Status.Verification
		return last.RequestedAt == req && (last.State == v1beta1.BackupVerifyPassed || last.State == v1beta1.BackupVerifyFailed)
	}, 2*time.Minute, 200*time.Millisecond, "backup %s answers verify request %s (last %+v)", name, req, last)
	return last
}

// Two backups of a volume with distinct data on a real S3 server: deleting
// the first has the target's owner garbage-collect the packs only it
// referenced, and the second keeps its packs and restores exactly. Then the
// verify action: Passed with the chunk count (asked through kubectl), and,
// after one byte of a stored pack is flipped on the server's disk, Failed
// naming the backup, the chunk and the pack.
func testBackupGCAfterDeleteAndVerify(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t)
	s3Target(t, backup.DefaultBackupTargetName, "s3://backups@us-east-1/e2e-gc", map[string]string{
		backupstore.SecretEndpoint: srv.Endpoint, backupstore.SecretAccessKey: srv.AccessKey,
		backupstore.SecretSecretKey: srv.SecretKey})
	waitTarget(t, backup.DefaultBackupTargetName, true, "listed")
	store, err := backupstore.NewS3Store(s3Config(srv, "e2e-gc"))
	require.NoError(t, err)
	tgt, err := backupstore.Open(ctx, store, backupstore.Options{})
	require.NoError(t, err)

	const vol, size = "e2e-gc", int64(64 << 20)
	createVolume(t, vol, "64Mi", 2)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, time.Minute, "attached to node-1", attachedTo("node-1"))

	// b1: 8 MiB of random data. b2: other random data over the same 8 MiB
	// and 4 more: b2 shares no chunk, hence no pack, with b1.
	writeImage(t, v.Status.FrontendEndpoint, size, [2]int64{0, 8 << 20})
	createSnapshot(t, vol, "e2e-gc-s1")
	waitSnapshotsReady(t, vol, 1, time.Minute)
	createBackup(t, "e2e-gc-b1", "e2e-gc-s1", "")
	waitBackupCompleted(t, "e2e-gc-b1")
	sum2 := writeImage(t, v.Status.FrontendEndpoint, size, [2]int64{0, 8 << 20}, [2]int64{16 << 20, 4 << 20})
	require.Equal(t, sum2, volumeSum(t, v.Status.FrontendEndpoint, size))
	createSnapshot(t, vol, "e2e-gc-s2")
	waitSnapshotsReady(t, vol, 2, time.Minute)
	createBackup(t, "e2e-gc-b2", "e2e-gc-s2", "")
	waitBackupCompleted(t, "e2e-gc-b2")

	m1, err := tgt.LoadManifest(ctx, vol, "e2e-gc-b1")
	require.NoError(t, err)
	m2, err := tgt.LoadManifest(ctx, vol, "e2e-gc-b2")
	require.NoError(t, err)
	only1, kept := packKeys(m1), packKeys(m2)
	for _, k := range only1 {
		require.NotContains(t, kept, k, "b2 shares no pack with b1")
	}
	before := storedPacks(t, store)
	require.ElementsMatch(t, append(append([]string{}, only1...), kept...), before)
	var bytes1 int64
	for _, k := range only1 {
		o, err := store.Stat(ctx, k)
		require.NoError(t, err)
		bytes1 += o.Size
	}
	t.Logf("before the delete: %d packs on the server, %d only b1's (%d bytes), %d b2's", len(before), len(only1), bytes1, len(kept))

	// No grace: b1's packs are seconds old. Inflight markers still protect
	// a running backup; none runs now.
	restore := setSetting(t, stypes.SettingBackupGCGrace, "0")
	t.Cleanup(restore)
	require.NoError(t, env.adminStrata.StrataV1beta1().Backups(ns).Delete(ctx, "e2e-gc-b1", metav1.DeleteOptions{}))
	waitBackupGone(t, "e2e-gc-b1")
	require.Eventually(t, func() bool {
		return strings.Join(storedPacks(t, store), ",") == strings.Join(kept, ",")
	}, time.Minute, 500*time.Millisecond, "only b2's packs are left")
	var msg string
	require.Eventually(t, func() bool {
		msg = eventMessages(t, backup.DefaultBackupTargetName, backup.EventReasonGarbageCollected)
		return msg != ""
	}, 30*time.Second, 200*time.Millisecond, "a GarbageCollected event on the target")
	t.Logf("GarbageCollected: %s", msg)
	assert.Contains(t, msg, "packs referenced by 1 backups")
	_, err = store.Stat(ctx, "index/"+m1.Packs[0].String())
	assert.ErrorIs(t, err, backupstore.ErrNotFound, "the index objects of deleted packs went too")
	m2, err = tgt.LoadManifest(ctx, vol, "e2e-gc-b2")
	require.NoError(t, err)
	assert.Equal(t, sum2, restoredSum(t, tgt, m2), "b2 restores to the volume at s2")

	// Verify, asked through kubectl: every data chunk reads back.
	kubectl(t, "-n", ns, "patch", "bk", "e2e-gc-b2", "--type", "merge", "-p", `{"spec":{"verifyRequestedAt":"first"}}`)
	ver := waitVerified(t, "e2e-gc-b2", "first")
	require.Equal(t, v1beta1.BackupVerifyPassed, ver.State, "verify: %s", ver.Error)
	var dataChunks int64
	for _, e := range m2.Entries {
		if e.Kind == backupstore.KindData {
			dataChunks++
		}
	}
	assert.Equal(t, dataChunks, ver.Chunks)
	assert.Equal(t, int64(12), ver.Chunks, "12 MiB of data in 1 MiB chunks")
	t.Logf("verify passed: %d chunks", ver.Chunks)

	// Flip one byte of b2's first pack where versitygw's posix backend keeps
	// it: the first chunk in it is then bad (random data is stored raw).
	h := m2.Packs[0].String()
	pack := filepath.Join(srv.Dir, "data", "backups", "e2e-gc", "packs", h[:2], h)
	data, err := os.ReadFile(pack)
	require.NoError(t, err, "the pack object as a file on the server")
	data[8+4096] ^= 0x01
	require.NoError(t, os.WriteFile(pack, data, 0o644))

	require.NoError(t, retryOnConflict(func() error {
		b, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(ctx, "e2e-gc-b2", metav1.GetOptions{})
		if err != nil {
			return err
		}
		b.Spec.VerifyRequestedAt = "second"
		_, err = env.adminStrata.StrataV1beta1().Backups(ns).Update(ctx, b, metav1.UpdateOptions{})
		return err
	}))
	ver = waitVerified(t, "e2e-gc-b2", "second")
	t.Logf("verify after the flip: %s", ver.Error)
	require.Equal(t, v1beta1.BackupVerifyFailed, ver.State)
	assert.Equal(t, dataChunks, ver.Chunks)
	assert.Contains(t, ver.Error, "verify backup e2e-gc-b2 of volume e2e-gc: 1 of 12 chunks bad")
	assert.Regexp(t, `backup e2e-gc-b2 of volume e2e-gc: chunk \d+ \(offset \d+, id [0-9a-f]{64}\) in pack `+h+`: checksum mismatch`, ver.Error)
	assertEvent(t, "e2e-gc-b2", backup.EventReasonBackupVerifyFailed, "in pack "+h)
	assertEvent(t, "e2e-gc-b2", backup.EventReasonBackupVerified, "all 12 data chunks")
}

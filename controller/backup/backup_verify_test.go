package backup

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// verifyTarget is a file:// target with backup b1 of volume v1: five
// chunks of random data (stored raw, so a flipped byte is a flipped byte
// of a chunk), in one pack.
func verifyTarget(t *testing.T) (string, *backupstore.Manifest) {
	t.Helper()
	dir := t.TempDir()
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(context.Background(), fs, backupstore.Options{ChunkSize: 64 << 10})
	require.NoError(t, err)
	data := randomData(42, 5*64<<10)
	m, err := tgt.Backup(context.Background(), backupstore.BackupInput{Volume: "v1", Backup: "b1", Snapshot: "s1",
		Size: int64(len(data)), Source: bytes.NewReader(data)})
	require.NoError(t, err)
	require.Len(t, m.Packs, 1)
	return dir, m
}

func verifyRequested(req string, v *v1beta1.BackupVerification) func(*v1beta1.Backup) {
	return func(b *v1beta1.Backup) { b.Spec.VerifyRequestedAt, b.Status.Verification = req, v }
}

func wantVerification(state v1beta1.BackupVerifyState, chunks int64, errText string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		v := backupOf(t, env, "b1").Status.Verification
		require.NotNil(t, v)
		assert.Equal(t, state, v.State)
		assert.Equal(t, chunks, v.Chunks)
		if errText == "" {
			assert.Empty(t, v.Error)
		} else {
			assert.Contains(t, v.Error, errText)
		}
	}
}

// The decisions that need no read of the target.
func TestSyncBackupVerifyDecisions(t *testing.T) {
	dir, _ := verifyTarget(t)
	url := "file://" + dir
	done := &v1beta1.BackupVerification{RequestedAt: "r1", State: v1beta1.BackupVerifyPassed, Chunks: 5}
	completed := func(mut ...func(*v1beta1.Backup)) *v1beta1.Backup {
		b := completedBackup("b1", "s1", url, "2026-11-21T10:00:00Z")
		for _, m := range mut {
			m(b)
		}
		return b
	}
	fixture.RunSyncCases(t, []fixture.SyncCase{
		{Name: "no request: nothing", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(), completed())},
		{Name: "a request answered already: nothing", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(), completed(verifyRequested("r1", done)))},
		{Name: "a failed backup cannot be verified, and says so", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(), completed(verifyRequested("r1", nil), func(b *v1beta1.Backup) {
				b.Status.State = v1beta1.BackupStateError
			})),
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Warning BackupVerifyFailed"},
			Check: wantVerification(v1beta1.BackupVerifyFailed, 0, "backup b1 is in state Error: only a completed backup can be verified")},
		{Name: "a backup on another target than the default", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(), completed(verifyRequested("r2", done), func(b *v1beta1.Backup) {
				b.Status.URL = "file:///elsewhere"
			})),
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Warning BackupVerifyFailed"},
			Check: wantVerification(v1beta1.BackupVerifyFailed, 0, "backup b1 is on file:///elsewhere, not on the default target")},
		{Name: "a backup still being taken: its verify waits for the end", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(), fixture.ReadySnap("s1"), fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStatePending, 0),
				verifyRequested("r1", nil))),
			WantWrites: []string{"update volumeattachments v1", "update backups/status b1"},
			Check: func(t *testing.T, env *dstest.Env) {
				assert.Nil(t, backupOf(t, env, "b1").Status.Verification)
			}},
	}, backupSyncFunc())
}

// A request is answered InProgress, then Passed with the chunk count; a
// byte flipped in the stored pack makes the next request Failed, naming
// the backup, the chunk and the pack.
func TestBackupVerifyPassesThenFailsNamingTheBlock(t *testing.T) {
	dir, m := verifyTarget(t)
	url := "file://" + dir
	env := dstest.New(t, fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(),
		completedBackup("b1", "s1", url, "2026-11-21T10:00:00Z")), []runtime.Object{fixture.Lease("node-1", 0)})
	rec := record.NewFakeRecorder(20)
	c, err := NewBackupController(logrus.New(), env.DS, rec, "node-1", fixture.NewFakeConnector(nil), nil)
	require.NoError(t, err)
	ctx := context.Background()
	key := fixture.NS + "/b1"

	request := func(req string) {
		t.Helper()
		b := backupOf(t, env, "b1")
		b.Spec.VerifyRequestedAt = req
		_, err := env.Strata.StrataV1beta1().Backups(fixture.NS).Update(ctx, b, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			got, err := env.DS.Backups.GetRO("b1")
			return err == nil && got.Spec.VerifyRequestedAt == req
		}, 5*time.Second, 10*time.Millisecond)
	}
	// sync runs one sync and waits until the cache holds what it wrote.
	sync := func() *v1beta1.Backup {
		t.Helper()
		require.NoError(t, c.syncBackup(ctx, key))
		b := backupOf(t, env, "b1")
		require.Eventually(t, func() bool {
			got, err := env.DS.Backups.GetRO("b1")
			return err == nil && reflect.DeepEqual(got.Status, b.Status) && reflect.DeepEqual(got.Spec, b.Spec)
		}, 5*time.Second, 10*time.Millisecond)
		return b
	}
	waitDone := func() {
		t.Helper()
		require.Eventually(t, func() bool {
			r := c.verifyRunOf(backupOf(t, env, "b1"))
			return r != nil && r.done
		}, 10*time.Second, 10*time.Millisecond, "the verify ends")
	}

	request("r1")
	b := sync()
	require.NotNil(t, b.Status.Verification)
	assert.Equal(t, v1beta1.BackupVerification{RequestedAt: "r1", State: v1beta1.BackupVerifyInProgress}, *b.Status.Verification)
	waitDone()
	b = sync()
	assert.Equal(t, v1beta1.BackupVerifyPassed, b.Status.Verification.State)
	assert.Equal(t, int64(5), b.Status.Verification.Chunks, "every data chunk read back")
	assert.False(t, b.Status.Verification.VerifiedAt.IsZero())
	assert.Contains(t, fixture.DrainEvents(rec), "Normal BackupVerified")
	env.ClearActions()
	sync()
	assert.Empty(t, fixture.Writes(env.Strata.Actions()), "an answered request is not rewritten")

	// Flip one byte of the first chunk stored in the pack (after its
	// 8-byte magic).
	h := m.Packs[0].String()
	pack := filepath.Join(dir, "packs", h[:2], h)
	data, err := os.ReadFile(pack)
	require.NoError(t, err)
	data[8+1000] ^= 0xff
	require.NoError(t, os.WriteFile(pack, data, 0o644))

	request("r2")
	b = sync()
	assert.Equal(t, v1beta1.BackupVerifyInProgress, b.Status.Verification.State, "InProgress is written first")
	waitDone()
	b = sync()
	v := b.Status.Verification
	assert.Equal(t, "r2", v.RequestedAt)
	assert.Equal(t, v1beta1.BackupVerifyFailed, v.State)
	assert.Equal(t, int64(5), v.Chunks)
	assert.Contains(t, v.Error, "verify backup b1 of volume v1: 1 of 5 chunks bad")
	assert.Regexp(t, `backup b1 of volume v1: chunk \d \(offset \d+, id [0-9a-f]{64}\) in pack `+h+`: checksum mismatch`, v.Error)
	assert.Contains(t, fixture.DrainEvents(rec), "Warning BackupVerifyFailed")
}

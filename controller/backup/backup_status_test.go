package backup

import (
	"bytes"
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// twoBackupsDir is a file:// target holding backups b0 (snapshot s0) and b1
// (snapshot s1, one chunk changed) of volume v1; b1 is incremental on b0
// when incremental, else a full backup (as an instance manager older than
// Header.Base writes it: no base in the manifest).
func twoBackupsDir(t *testing.T, incremental bool) (string, *backupstore.Manifest) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(ctx, fs, backupstore.Options{ChunkSize: 64 << 10})
	require.NoError(t, err)
	data := bytes.Repeat([]byte("strata"), 50000)
	b0, err := tgt.Backup(ctx, backupstore.BackupInput{Volume: "v1", Backup: "b0", Snapshot: "s0",
		Size: int64(len(data)), Source: bytes.NewReader(data)})
	require.NoError(t, err)
	copy(data, "a new first chunk")
	in := backupstore.BackupInput{Volume: "v1", Backup: "b1", Snapshot: "s1", Size: int64(len(data)), Source: bytes.NewReader(data)}
	if incremental {
		in.Base, in.Changed = b0, []backupstore.Range{{Offset: 0, Length: 64 << 10}}
	}
	m1, err := tgt.Backup(ctx, in)
	require.NoError(t, err)
	return dir, m1
}

// A completed backup says what it did (issue 23): the bytes it uploaded and
// the backup it is incremental on, from the manifest or, for a manifest
// that names no base, from the job. Both stay: a later sync and the
// mirror's poll keep them.
func TestCompletedBackupSaysWhatItDid(t *testing.T) {
	cases := []struct {
		name        string
		incremental bool   // b1's manifest names b0 as its base
		jobBase     string // the base the job reported
		wantOn      string
	}{
		{name: "a full backup: what it uploaded, no base"},
		{name: "an incremental backup: what it uploaded and its base", incremental: true, jobBase: "b0", wantOn: "b0"},
		{name: "a manifest that names no base: the job's", jobBase: "b0", wantOn: "b0"},
	}
	for _, tc := range cases {
		dir, m1 := twoBackupsDir(t, tc.incremental)
		url := "file://" + dir
		running := fixture.Backup("b1", "s1", func(b *v1beta1.Backup) {
			fixture.BackupState(v1beta1.BackupStateInProgress, 90)(b)
			b.Status.SnapshotName, b.Status.URL, b.Status.BytesDone, b.Status.BytesTotal = "s1", url, 9, 10
		})
		job := &engineapi.BackupStatus{Snapshot: "s1", State: engineapi.JobStateCompleted, Progress: 100,
			BaseBackup: tc.jobBase, NewBytes: m1.Stats.NewBytes, StoredBytes: m1.Stats.StoredBytes}
		fixture.RunSyncCases(t, []fixture.SyncCase{{Name: tc.name, Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), attachedVolume(), fixture.RunningEngine("v1"),
				fixture.IM(v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}), fixture.ReadySnap("s1"),
				fixture.VA(backupTicketFor("b1")), running),
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Normal BackupCompleted"},
			Check: func(t *testing.T, env *dstest.Env) {
				b := backupOf(t, env, "b1")
				assert.Equal(t, v1beta1.BackupStateCompleted, b.Status.State)
				assert.Equal(t, m1.Stats.NewBytes, b.Status.UploadedBytes)
				assert.Positive(t, b.Status.UploadedBytes)
				assert.Less(t, b.Status.UploadedBytes, b.Status.Size, "only the changed chunk is uploaded")
				assert.Equal(t, tc.wantOn, b.Status.IncrementalOn)
				assert.Zero(t, b.Status.BytesDone, "the running upload's counters are cleared")
				assertBackupStatusKept(t, env, dir, m1, b.Status)
			}}}, backupSyncFunc(engineWithBackup(job)))
	}
}

// assertBackupStatusKept syncs the completed b1 again and lets the mirror
// find its manifest: neither writes its status.
func assertBackupStatusKept(t *testing.T, env *dstest.Env, dir string, m1 *backupstore.Manifest, want v1beta1.BackupStatus) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		got, err := env.DS.Backups.GetRO("b1")
		return err == nil && reflect.DeepEqual(got.Status, want)
	}, 5*time.Second, 10*time.Millisecond, "the cache holds the completed status")
	env.ClearActions()
	bc, err := NewBackupController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", fixture.NewFakeConnector(nil),
		syncedInstanceCache(engineWithBackup(nil)))
	require.NoError(t, err)
	require.NoError(t, bc.syncBackup(ctx, fixture.NS+"/b1"))
	btc, err := NewBackupTargetController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
	require.NoError(t, err)
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(ctx, fs, backupstore.Options{})
	require.NoError(t, err)
	bt, err := env.DS.BackupTargets.GetRO("default")
	require.NoError(t, err)
	require.NoError(t, btc.mirrorBackup(ctx, bt, tgt, backupstore.BackupInfo{Header: m1.Header}))
	assert.NotContains(t, fixture.Writes(env.Strata.Actions()), "update backups/status b1", "the status is kept as it is")
	assert.Equal(t, want, backupOf(t, env, "b1").Status)
}

package backup

import (
	"bytes"
	"context"
	"fmt"
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
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// backupTargetDir is a file:// target holding, when withB1, backup b1 of
// volume v1 (snapshot s1).
func backupTargetDir(t *testing.T, withB1 bool) string {
	t.Helper()
	dir := t.TempDir()
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(context.Background(), fs, backupstore.Options{ChunkSize: 64 << 10})
	require.NoError(t, err)
	if withB1 {
		data := bytes.Repeat([]byte("strata"), 50000)
		_, err = tgt.Backup(context.Background(), backupstore.BackupInput{Volume: "v1", Backup: "b1", Snapshot: "s1",
			Size: int64(len(data)), Source: bytes.NewReader(data)})
		require.NoError(t, err)
	}
	return dir
}

func availableTarget(dir string) *v1beta1.BackupTarget {
	bt := testBackupTarget("file://"+dir, "")
	bt.Status.Available = true
	return bt
}

func completedBackup(name, snapshot, url, createdAt string) *v1beta1.Backup {
	return fixture.Backup(name, snapshot, func(b *v1beta1.Backup) {
		b.Labels = map[string]string{types.LabelVolume: "v1"}
		b.Status = v1beta1.BackupStatus{State: v1beta1.BackupStateCompleted, Progress: 100, URL: url, SnapshotName: snapshot,
			VolumeName: "v1", BackupCreatedAt: createdAt, OwnerID: "node-1"}
	})
}

// attachedVolume is v1 attached to node-1.
func attachedVolume() *v1beta1.Volume {
	return fixture.Volume(func(v *v1beta1.Volume) {
		v.Spec.NodeID, v.Status.CurrentNodeID, v.Status.State = "node-1", "node-1", v1beta1.VolumeStateAttached
	})
}

func backupTicketFor(b string) *v1beta1.AttachmentTicket {
	return &v1beta1.AttachmentTicket{ID: backupTicketID(b), Type: v1beta1.AttacherTypeBackupController, NodeID: "node-1",
		OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Backup",
			Namespace: fixture.NS, Name: b, UID: "uid-" + b},
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.AnyValue}}
}

// engineWithBackup is v1's engine instance with the status of backup b1.
func engineWithBackup(st *engineapi.BackupStatus) *engineapi.Instance {
	inst := &engineapi.Instance{Name: "v1-e-0", Type: engineapi.InstanceTypeEngine, VolumeName: "v1",
		State: engineapi.InstanceStateRunning, Revision: 7}
	if st != nil {
		inst.BackupStatus = map[string]*engineapi.BackupStatus{"b1": st}
	}
	return inst
}

// syncedInstanceCache is an instance cache that has replayed instances.
func syncedInstanceCache(instances ...*engineapi.Instance) *kit.InstanceCache {
	cache := kit.NewInstanceCache()
	cache.StreamOpened()
	for _, inst := range instances {
		cache.Apply(&engineapi.WatchEvent{Kind: engineapi.WatchUpdated, Instance: inst})
	}
	cache.Apply(&engineapi.WatchEvent{Kind: engineapi.WatchSynced})
	return cache
}

func backupSyncFunc(instances ...*engineapi.Instance) fixture.SyncFunc {
	return func(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
		c, err := NewBackupController(logrus.New(), env.DS, rec, me, dp, syncedInstanceCache(instances...))
		if err != nil {
			return nil, err
		}
		return c.syncBackup, nil
	}
}

func backupOf(t *testing.T, env *dstest.Env, name string) *v1beta1.Backup {
	t.Helper()
	b, err := env.Strata.StrataV1beta1().Backups(fixture.NS).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return b
}

func wantBackup(state v1beta1.BackupState, errText string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		b := backupOf(t, env, "b1")
		assert.Equal(t, state, b.Status.State)
		if errText == "" {
			assert.Empty(t, b.Status.Error)
		} else {
			assert.Contains(t, b.Status.Error, errText)
		}
	}
}

func wantTicket(node string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
		require.NoError(t, err)
		tk := va.Spec.AttachmentTickets[backupTicketID("b1")]
		if node == "" {
			assert.Nil(t, tk, "the backup's ticket is released")
			return
		}
		require.NotNil(t, tk)
		assert.Equal(t, v1beta1.AttacherTypeBackupController, tk.Type)
		assert.Equal(t, node, tk.NodeID)
		assert.Equal(t, "Backup", tk.OwnerRef.Kind)
	}
}

func TestSyncBackup(t *testing.T) {
	dir := backupTargetDir(t, false)
	url := "file://" + dir
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}}
	attached := func(extra ...runtime.Object) []runtime.Object {
		return fixture.WithNodes(append([]runtime.Object{availableTarget(dir), attachedVolume(), fixture.RunningEngine("v1"), im,
			fixture.ReadySnap("s1")}, extra...)...)
	}
	unavailable := testBackupTarget(url, "")
	unavailable.Status.Conditions = []metav1.Condition{{Type: ConditionTypeAvailable, Status: metav1.ConditionFalse,
		Reason: BackupTargetReasonUnreachable, Message: "connection refused"}}
	mirrored := fixture.Backup("b1", "s1", func(b *v1beta1.Backup) {
		b.Finalizers, b.Annotations = nil, map[string]string{AnnotationBackupMirrored: "true"}
	})
	inProgress := func(p int32) *engineapi.BackupStatus {
		return &engineapi.BackupStatus{Snapshot: "s1", State: engineapi.JobStateInProgress, Progress: p,
			BytesDone: int64(p) << 20, BytesTotal: 100 << 20}
	}
	// Each case with the job status its engine's instance shows.
	cases := []struct {
		fixture.SyncCase
		job *engineapi.BackupStatus
	}{
		{SyncCase: fixture.SyncCase{Name: "a missing finalizer is added first", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(), fixture.Backup("b1", "s1", func(b *v1beta1.Backup) { b.Finalizers = nil })),
			WantWrites: []string{"update backups b1"}}},
		{SyncCase: fixture.SyncCase{Name: "a mirrored backup is the mirror's until it has a state", Key: fixture.NS + "/b1",
			Objects: attached(fixture.VA(), mirrored)}},
		{SyncCase: fixture.SyncCase{Name: "a named snapshot of an attached volume: the job starts on the engine's node", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(), fixture.Backup("b1", "s1")),
			WantWrites: []string{"update volumeattachments v1", "update backups/status b1"},
			WantCalls:  []string{"SnapshotBackup v1-e-0 s1 b1 v1 " + url},
			WantEvents: []string{"Normal BackupStarted"},
			Check: fixture.AllChecks(wantBackup(v1beta1.BackupStateInProgress, ""), wantTicket("node-1"), func(t *testing.T, env *dstest.Env) {
				b := backupOf(t, env, "b1")
				assert.Equal(t, "v1", b.Status.VolumeName)
				assert.Equal(t, "s1", b.Status.SnapshotName)
				assert.Equal(t, url, b.Status.URL)
			})}},
		{SyncCase: fixture.SyncCase{Name: "incremental on the newest completed backup whose snapshot still exists", Key: fixture.NS + "/b1",
			Objects: attached(fixture.VA(), fixture.Backup("b1", "s1"), fixture.ReadySnap("s0"),
				completedBackup("b-old", "s0", url, "2026-11-20T10:00:00Z"),
				completedBackup("b-newer-snap-gone", "s-gone", url, "2026-11-21T10:00:00Z"),
				completedBackup("b-other-target", "s0", "file:///elsewhere", "2026-11-21T11:00:00Z")),
			WantWrites: []string{"update volumeattachments v1", "update backups/status b1"},
			WantCalls:  []string{"SnapshotBackup v1-e-0 s1 b1 v1 " + url + " base=b-old/s0"},
			WantEvents: []string{"Normal BackupStarted"}}},
		{SyncCase: fixture.SyncCase{Name: "no default target: the backup waits and says so", Key: fixture.NS + "/b1",
			Objects:    fixture.WithNodes(attachedVolume(), fixture.RunningEngine("v1"), im, fixture.ReadySnap("s1"), fixture.VA(), fixture.Backup("b1", "s1")),
			WantWrites: []string{"update backups/status b1"},
			Check:      wantBackup(v1beta1.BackupStatePending, "no backup target: create BackupTarget strata-system/default")}},
		{SyncCase: fixture.SyncCase{Name: "an unavailable target: the backup waits with the target's message", Key: fixture.NS + "/b1",
			Objects:    fixture.WithNodes(unavailable, attachedVolume(), fixture.RunningEngine("v1"), im, fixture.ReadySnap("s1"), fixture.VA(), fixture.Backup("b1", "s1")),
			WantWrites: []string{"update backups/status b1"},
			Check:      wantBackup(v1beta1.BackupStatePending, "is not available: connection refused")}},
		{SyncCase: fixture.SyncCase{Name: "a snapshot that does not exist is refused", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(), fixture.Backup("b1", "nope")),
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Warning BackupFailed"},
			Check: wantBackup(v1beta1.BackupStateError, "snapshot nope not found")}},
		{SyncCase: fixture.SyncCase{Name: "a backup naming neither a snapshot nor a volume is refused", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(), fixture.Backup("b1", "")),
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Warning BackupFailed"},
			Check: wantBackup(v1beta1.BackupStateError, "neither spec.snapshotName nor the label")}},
		{SyncCase: fixture.SyncCase{Name: "a whole-volume backup takes a system snapshot owned by the Backup", Key: fixture.NS + "/b1",
			Objects: attached(fixture.VA(), fixture.Backup("b1", "", func(b *v1beta1.Backup) {
				b.Labels = map[string]string{types.LabelVolume: "v1"}
			})),
			WantWrites: []string{"update volumeattachments v1", "create snapshots b1", "update backups/status b1"},
			Check: fixture.AllChecks(wantBackup(v1beta1.BackupStatePending, ""), func(t *testing.T, env *dstest.Env) {
				s, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(context.Background(), "b1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.True(t, s.TakenForStrata())
				assert.True(t, s.Spec.CreateSnapshot)
				assert.Equal(t, "b1", backupOf(t, env, "b1").Status.SnapshotName)
			})}},
		{SyncCase: fixture.SyncCase{Name: "a detached volume is attached on this node through the backup's ticket", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.Engine(), im, fixture.ReadySnap("s1"), fixture.VA(),
				fixture.Backup("b1", "s1")),
			WantWrites: []string{"update volumeattachments v1", "update backups/status b1"},
			Check:      fixture.AllChecks(wantBackup(v1beta1.BackupStatePending, ""), wantTicket("node-1"))}},
		{SyncCase: fixture.SyncCase{Name: "an engine on another node: its manager takes the backup", Key: fixture.NS + "/b1", Me: "node-2",
			Objects: attached(fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStatePending, 0)))}},
		{SyncCase: fixture.SyncCase{Name: "progress below the step is not written", Key: fixture.NS + "/b1",
			Objects: attached(fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1", func(b *v1beta1.Backup) {
				fixture.BackupState(v1beta1.BackupStateInProgress, 10)(b)
				b.Status.SnapshotName, b.Status.URL = "s1", url
			}))}, job: inProgress(15)},
		{SyncCase: fixture.SyncCase{Name: "progress past the step is written", Key: fixture.NS + "/b1",
			Objects: attached(fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1", func(b *v1beta1.Backup) {
				fixture.BackupState(v1beta1.BackupStateInProgress, 10)(b)
				b.Status.SnapshotName, b.Status.URL = "s1", url
			})),
			WantWrites: []string{"update backups/status b1"},
			Check: func(t *testing.T, env *dstest.Env) {
				b := backupOf(t, env, "b1")
				assert.Equal(t, int32(25), b.Status.Progress)
				assert.Equal(t, []int64{25 << 20, 100 << 20}, []int64{b.Status.BytesDone, b.Status.BytesTotal})
			}}, job: inProgress(25)},
		{SyncCase: fixture.SyncCase{Name: "a failed job is retried later", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStateInProgress, 30))),
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Warning BackupFailed"},
			Check: wantBackup(v1beta1.BackupStatePending, "attempt 1 failed, retried in 10s: dial tcp: connection refused")}, job: &engineapi.BackupStatus{Snapshot: "s1", State: engineapi.JobStateError, Error: "dial tcp: connection refused"}},
		{SyncCase: fixture.SyncCase{Name: "an engine busy with another backup: retried with backoff", Key: fixture.NS + "/b1",
			Objects: attached(fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1")),
			DPErr:   map[string]error{"SnapshotBackup": fmt.Errorf("%w: a backup runs", engineapi.ErrBusy)},
			WantErr: "busy", WantWrites: []string{"update backups/status b1"},
			WantCalls: []string{"SnapshotBackup v1-e-0 s1 b1 v1 " + url},
			Check:     wantBackup(v1beta1.BackupStatePending, "another backup or restore of volume v1 runs")}},
		{SyncCase: fixture.SyncCase{Name: "a backup the instance manager refuses is not retried", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1")),
			DPErr:      map[string]error{"SnapshotBackup": fmt.Errorf("%w: snapshot s1 is not in the chain", engineapi.ErrInvalid)},
			WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Warning BackupFailed"},
			WantCalls: []string{"SnapshotBackup v1-e-0 s1 b1 v1 " + url},
			Check:     wantBackup(v1beta1.BackupStateError, "the instance manager refused the backup")}},
		{SyncCase: fixture.SyncCase{Name: "a finished backup releases its ticket", Key: fixture.NS + "/b1",
			Objects:    attached(fixture.VA(backupTicketFor("b1")), completedBackup("b1", "s1", url, "2026-11-21T10:00:00Z")),
			WantWrites: []string{"update volumeattachments v1"}, Check: wantTicket("")}},
	}
	for _, tc := range cases {
		fixture.RunSyncCases(t, []fixture.SyncCase{tc.SyncCase}, backupSyncFunc(engineWithBackup(tc.job)))
	}
}

func TestSyncBackupCompletesAndDeletes(t *testing.T) {
	dir := backupTargetDir(t, true)
	url := "file://" + dir
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}}
	running := fixture.Backup("b1", "s1", func(b *v1beta1.Backup) {
		fixture.BackupState(v1beta1.BackupStateInProgress, 90)(b)
		b.Status.SnapshotName, b.Status.URL = "s1", url
	})
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(context.Background(), fs, backupstore.Options{})
	require.NoError(t, err)
	m, err := tgt.LoadManifest(context.Background(), "v1", "b1")
	require.NoError(t, err)

	fixture.RunSyncCases(t, []fixture.SyncCase{{Name: "a completed job: the status the mirror would write, from the manifest", Key: fixture.NS + "/b1",
		Objects: fixture.WithNodes(availableTarget(dir), attachedVolume(), fixture.RunningEngine("v1"), im,
			fixture.Snapshot("s1", true, func(s *v1beta1.Snapshot) { s.Status.ReadyToUse, s.Status.CreationTime = true, "2026-11-21T11:00:00Z" }),
			fixture.VA(backupTicketFor("b1")), running),
		WantWrites: []string{"update backups/status b1"}, WantEvents: []string{"Normal BackupCompleted"},
		Check: func(t *testing.T, env *dstest.Env) {
			b := backupOf(t, env, "b1")
			want := completedBackupStatus(url, m.Header)
			want.OwnerID, want.SnapshotCreatedAt = "node-1", "2026-11-21T11:00:00Z"
			assert.Equal(t, want, b.Status)
			assert.Equal(t, m.Stats.StoredBytes, b.Status.Size)

			// The mirror finds it right and writes nothing.
			env.ClearActions()
			btc, err := NewBackupTargetController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				got, err := env.DS.Backups.GetRO("b1")
				return err == nil && got.Status.State == v1beta1.BackupStateCompleted
			}, 5*time.Second, 10*time.Millisecond)
			bt, err := env.DS.BackupTargets.GetRO("default")
			require.NoError(t, err)
			require.NoError(t, btc.mirrorBackup(context.Background(), bt, tgt, backupstore.BackupInfo{Header: m.Header}))
			assert.Empty(t, fixture.Writes(env.Strata.Actions()), "the mirror rewrites nothing")
		}}}, backupSyncFunc(engineWithBackup(&engineapi.BackupStatus{Snapshot: "s1", State: engineapi.JobStateCompleted,
		Progress: 100, StoredBytes: m.Stats.StoredBytes})))

	now := metav1.NewTime(dstest.Now)
	deletingBackup := func(b *v1beta1.Backup) *v1beta1.Backup { b.DeletionTimestamp = &now; return b }
	gone := t.TempDir() + "/gone"
	fixture.RunSyncCases(t, []fixture.SyncCase{
		{Name: "an unreachable target keeps the finalizer and says why", Key: fixture.NS + "/b1",
			Objects:    fixture.WithNodes(availableTarget(gone), fixture.Volume(), fixture.VA(), deletingBackup(completedBackup("b1", "s1", "file://"+gone, "x"))),
			WantErr:    "no such file or directory",
			WantWrites: []string{"update backups/status b1"},
			Check: func(t *testing.T, env *dstest.Env) {
				b := backupOf(t, env, "b1")
				assert.Contains(t, b.Finalizers, types.FinalizerName)
				assert.Contains(t, b.Status.Error, "deleting the backup from the target")
			}},
		{Name: "delete: the manifest goes from the target, then the ticket and the finalizer", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), fixture.Volume(), fixture.VA(backupTicketFor("b1")),
				deletingBackup(completedBackup("b1", "s1", url, "x"))),
			WantWrites: []string{"update volumeattachments v1", "update backuptargets default", "update backups b1"},
			WantEvents: []string{"Normal BackupDeleted"},
			Check: fixture.AllChecks(wantTicket(""), func(t *testing.T, env *dstest.Env) {
				_, err := tgt.LoadManifest(context.Background(), "v1", "b1")
				assert.ErrorIs(t, err, backupstore.ErrNotFound)
				bt, err := env.Strata.StrataV1beta1().BackupTargets(fixture.NS).Get(context.Background(), "default", metav1.GetOptions{})
				require.NoError(t, err)
				assert.NotEmpty(t, bt.Annotations[AnnotationBackupGCRequestedAt], "the target's owner is asked for a GC")
			})},
		{Name: "delete while the job runs: it waits for the job's end", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(availableTarget(dir), attachedVolume(), fixture.RunningEngine("v1"), im, fixture.VA(backupTicketFor("b1")),
				deletingBackup(fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStateInProgress, 40))))},
		{Name: "delete with no target: nothing to delete from, the finalizer goes (and no GC is asked)", Key: fixture.NS + "/b1",
			Objects:    fixture.WithNodes(fixture.Volume(), fixture.VA(), deletingBackup(completedBackup("b1", "s1", url, "x"))),
			WantWrites: []string{"update backups b1"}},
		{Name: "delete of a whole-volume backup deletes its snapshot", Key: fixture.NS + "/b1",
			Objects: fixture.WithNodes(fixture.Volume(), fixture.VA(), fixture.Snapshot("b1", true, func(s *v1beta1.Snapshot) {
				s.OwnerReferences = []metav1.OwnerReference{{Kind: "Backup", Name: "b1", UID: "uid-b1"}}
			}), deletingBackup(fixture.Backup("b1", "", func(b *v1beta1.Backup) { b.Labels = map[string]string{types.LabelVolume: "v1"} }))),
			WantWrites: []string{"delete snapshots b1", "update backups b1"}},
	}, backupSyncFunc(engineWithBackup(&engineapi.BackupStatus{Snapshot: "s1", State: engineapi.JobStateInProgress})))
}

// A failed job is started again once its backoff passed, and a new failure
// (after the attempt started) counts as the next attempt; the same error
// seen again, even at a later revision of the instance, does not.
func TestBackupJobRetries(t *testing.T) {
	dir := backupTargetDir(t, false)
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}}
	env := dstest.New(t, fixture.WithNodes(availableTarget(dir), attachedVolume(), fixture.RunningEngine("v1"), im, fixture.ReadySnap("s1"),
		fixture.VA(backupTicketFor("b1")), fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStateInProgress, 30))),
		[]runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)})
	cache := kit.NewInstanceCache()
	cache.StreamOpened()
	failed := func(rev uint64) {
		inst := engineWithBackup(&engineapi.BackupStatus{Snapshot: "s1", State: engineapi.JobStateError, Error: "connection refused"})
		inst.Revision = rev
		cache.Apply(&engineapi.WatchEvent{Kind: engineapi.WatchUpdated, Instance: inst})
	}
	failed(7)
	cache.Apply(&engineapi.WatchEvent{Kind: engineapi.WatchSynced})
	dp := fixture.NewFakeConnector(nil)
	c, err := NewBackupController(logrus.New(), env.DS, record.NewFakeRecorder(20), "node-1", dp, cache)
	require.NoError(t, err)
	sync := func(wantErr string) *v1beta1.Backup {
		t.Helper()
		require.NoError(t, c.syncBackup(context.Background(), fixture.NS+"/b1"))
		b := backupOf(t, env, "b1")
		require.Eventually(t, func() bool {
			got, err := env.DS.Backups.GetRO("b1")
			return err == nil && reflect.DeepEqual(got.Status, b.Status)
		}, 5*time.Second, 10*time.Millisecond)
		assert.Contains(t, b.Status.Error, wantErr)
		return b
	}

	// The backoff passes (the clock is left alone: the leases would expire).
	backoffPassed := func() { c.retries.EndBackoff("uid-b1") }
	sync("attempt 1 failed, retried in 10s")
	sync("attempt 1 failed")
	// The instance changes for another reason (a purge's progress): the
	// same error at a later revision is still the first failure.
	failed(8)
	sync("attempt 1 failed, retried in 10s")
	assert.Empty(t, dp.Calls(), "not before the backoff")
	backoffPassed()
	b := sync("")
	assert.Equal(t, v1beta1.BackupStateInProgress, b.Status.State)
	assert.Len(t, dp.Calls(), 1, "started again")
	failed(9)
	sync("attempt 2 failed, retried in 20s")
	for i := 3; i < maxBackupAttempts; i++ {
		backoffPassed()
		sync("")
		failed(uint64(10 + i))
		sync("failed, retried in")
	}
	backoffPassed()
	sync("")
	failed(100)
	b = sync("failed 5 times, last: connection refused")
	assert.Equal(t, v1beta1.BackupStateError, b.Status.State)
}

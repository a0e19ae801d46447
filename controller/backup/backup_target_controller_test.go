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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func testBackupTarget(url, secret string) *v1beta1.BackupTarget {
	return &v1beta1.BackupTarget{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: fixture.NS, Generation: 1},
		Spec: v1beta1.BackupTargetSpec{BackupTargetURL: url, CredentialSecret: secret}}
}

// oldTarget is a directory holding two backups of volume vol-a and one of
// vol-b, as a cluster that no longer exists left them.
func oldTarget(t *testing.T) string {
	dir := t.TempDir()
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(context.Background(), fs, backupstore.Options{ChunkSize: 64 << 10})
	require.NoError(t, err)
	data := bytes.Repeat([]byte("strata"), 50000)
	for _, b := range []struct{ volume, name string }{{"vol-a", "bk-a1"}, {"vol-a", "bk-a2"}, {"vol-b", "bk-b1"}} {
		_, err := tgt.Backup(context.Background(), backupstore.BackupInput{Volume: b.volume, Backup: b.name, Snapshot: "snap-" + b.name,
			Size: int64(len(data)), Source: bytes.NewReader(data), Labels: map[string]string{"app": "db"}})
		require.NoError(t, err)
	}
	return dir
}

func TestSyncBackupTarget(t *testing.T) {
	dir := oldTarget(t)
	s3Secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3-creds", Namespace: fixture.NS},
		Data: map[string][]byte{backupstore.SecretAccessKey: []byte("k"), backupstore.SecretSecretKey: []byte("s")}}
	cases := []struct {
		name       string
		target     *v1beta1.BackupTarget
		objects    []runtime.Object // more Strata objects
		extra      []runtime.Object
		wantReason string
		wantMsg    string
		wantWrites []string
	}{
		{name: "an old target's backups become CRs", target: testBackupTarget("file://"+dir, ""),
			wantReason: BackupTargetReasonReachable,
			wantWrites: []string{"create backups bk-a1", "update backups/status bk-a1", "create backups bk-a2",
				"update backups/status bk-a2", "create backupvolumes vol-a", "update backupvolumes/status vol-a",
				"create backups bk-b1", "update backups/status bk-b1", "create backupvolumes vol-b",
				"update backupvolumes/status vol-b", "update backuptargets/status default"}},
		{name: "a BackupVolume the target holds no backup of, with no Backup and no volume, goes",
			target: testBackupTarget("file://"+dir, ""), objects: []runtime.Object{testBackupVolume("vol-gone", "bk-x")},
			wantReason: BackupTargetReasonReachable,
			wantWrites: []string{"create backups bk-a1", "update backups/status bk-a1", "create backups bk-a2",
				"update backups/status bk-a2", "create backupvolumes vol-a", "update backupvolumes/status vol-a",
				"create backups bk-b1", "update backups/status bk-b1", "create backupvolumes vol-b",
				"update backupvolumes/status vol-b", "delete backupvolumes vol-gone", "update backuptargets/status default"}},
		{name: "a directory that is not there (an NFS mount missing)", target: testBackupTarget("file:///nonexistent/backups", ""),
			wantReason: BackupTargetReasonInvalid, wantMsg: "backup target /nonexistent/backups: stat /nonexistent/backups: no such file or directory",
			wantWrites: []string{"update backuptargets/status default"}},
		{name: "an unknown scheme", target: testBackupTarget("nfs://host/x", ""),
			wantReason: BackupTargetReasonInvalid, wantMsg: `the scheme must be s3:// or file://`,
			wantWrites: []string{"update backuptargets/status default"}},
		{name: "an s3 target whose Secret is missing", target: testBackupTarget("s3://b@us-east-1/x", "nope"),
			wantReason: BackupTargetReasonCredentials, wantMsg: "spec.credentialSecret: Secret strata-system/nope not found",
			wantWrites: []string{"update backuptargets/status default"}},
		{name: "an s3 target whose Secret lacks the endpoint", target: testBackupTarget("s3://b@us-east-1/x", "s3-creds"),
			extra: []runtime.Object{s3Secret}, wantReason: BackupTargetReasonInvalid, wantMsg: "the credential Secret has no AWS_ENDPOINTS",
			wantWrites: []string{"update backuptargets/status default"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kube := append([]runtime.Object{fixture.Lease("node-1", 0)}, tc.extra...)
			env := dstest.New(t, append([]runtime.Object{fixture.SchedNode("node-1"), tc.target}, tc.objects...), kube)
			rec := record.NewFakeRecorder(10)
			c, err := NewBackupTargetController(logrus.New(), env.DS, rec, "node-1")
			require.NoError(t, err)
			env.ClearActions()
			require.NoError(t, c.syncBackupTarget(context.Background(), fixture.NS+"/default"))
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()))
			bt, err := env.Strata.StrataV1beta1().BackupTargets(fixture.NS).Get(context.Background(), "default", metav1.GetOptions{})
			require.NoError(t, err)
			cond := meta.FindStatusCondition(bt.Status.Conditions, ConditionTypeAvailable)
			require.NotNil(t, cond)
			assert.Equal(t, tc.wantReason, cond.Reason)
			assert.Equal(t, tc.wantMsg == "", bt.Status.Available)
			assert.Contains(t, cond.Message, tc.wantMsg)
			if tc.wantMsg != "" {
				assert.Equal(t, []string{"Warning BackupTargetUnavailable"}, fixture.DrainEvents(rec))
			} else {
				bk, err := env.Strata.StrataV1beta1().Backups(fixture.NS).Get(context.Background(), "bk-a2", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, v1beta1.BackupStateCompleted, bk.Status.State)
				assert.Equal(t, "vol-a", bk.Status.VolumeName)
				assert.Equal(t, "snap-bk-a2", bk.Status.SnapshotName)
				assert.Equal(t, map[string]string{"app": "db"}, bk.Status.Labels)
				assert.Positive(t, bk.Status.Size)
				bv, err := env.Strata.StrataV1beta1().BackupVolumes(fixture.NS).Get(context.Background(), "vol-a", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "bk-a2", bv.Status.LastBackupName, "the newest backup of the volume")
				assert.Equal(t, int64(300000), bv.Status.Size)
			}

			// Nothing changed: a second look writes nothing (the clock did not move).
			env.ClearActions()
			waitCacheHas(t, env)
			require.NoError(t, c.syncBackupTarget(context.Background(), fixture.NS+"/default"))
			assert.Empty(t, fixture.Writes(env.Strata.Actions()), "an unchanged target and its backups are not rewritten")
		})
	}
}

// waitCacheHas waits until the informers hold what the sync wrote (the
// fake clientset keeps no resource versions, so the statuses are compared).
func waitCacheHas(t *testing.T, env *dstest.Env) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		bts, _ := env.Strata.StrataV1beta1().BackupTargets(fixture.NS).List(ctx, metav1.ListOptions{})
		bks, _ := env.Strata.StrataV1beta1().Backups(fixture.NS).List(ctx, metav1.ListOptions{})
		bvs, _ := env.Strata.StrataV1beta1().BackupVolumes(fixture.NS).List(ctx, metav1.ListOptions{})
		for _, o := range bts.Items {
			if got, err := env.DS.BackupTargets.GetRO(o.Name); err != nil || !reflect.DeepEqual(got.Status, o.Status) {
				return false
			}
		}
		for _, o := range bks.Items {
			if got, err := env.DS.Backups.GetRO(o.Name); err != nil || !reflect.DeepEqual(got.Status, o.Status) {
				return false
			}
		}
		for _, o := range bvs.Items {
			if got, err := env.DS.BackupVolumes.GetRO(o.Name); err != nil || !reflect.DeepEqual(got.Status, o.Status) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the cache holds the sync's writes")
}

// A backup deleted after the listing was read is not brought back as a
// Backup CR: the mirror asks for the manifest before it creates one.
func TestMirrorDoesNotRecreateADeletedBackup(t *testing.T) {
	dir := oldTarget(t)
	fs, err := backupstore.NewFileStore(dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(context.Background(), fs, backupstore.Options{})
	require.NoError(t, err)
	listed, err := tgt.ListBackups(context.Background())
	require.NoError(t, err)
	require.Len(t, listed, 3)
	require.NoError(t, tgt.DeleteBackup(context.Background(), "vol-a", "bk-a1")) // deleted since the listing

	env := dstest.New(t, []runtime.Object{testBackupTarget("file://"+dir, "")}, nil)
	c, err := NewBackupTargetController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
	require.NoError(t, err)
	bt, err := env.DS.BackupTargets.GetRO("default")
	require.NoError(t, err)
	require.NoError(t, c.mirrorBackups(context.Background(), bt, tgt, listed))
	bks, err := env.Strata.StrataV1beta1().Backups(fixture.NS).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var names []string
	for _, b := range bks.Items {
		names = append(names, b.Name)
	}
	assert.ElementsMatch(t, []string{"bk-a2", "bk-b1"}, names)
}

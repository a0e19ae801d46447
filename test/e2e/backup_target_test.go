package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/devtools/s3server"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// startS3 runs a real S3-compatible server (versitygw) for one test, with
// a bucket "backups".
func startS3(t *testing.T) *s3server.Server {
	t.Helper()
	root, err := localcluster.RepoRoot()
	require.NoError(t, err)
	bin, err := s3server.Binary(context.Background(), root)
	require.NoError(t, err)
	srv, err := s3server.Start(bin, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Stop() })
	store, err := backupstore.NewS3Store(s3Config(srv, ""))
	require.NoError(t, err)
	require.NoError(t, store.MakeBucket(context.Background()))
	return srv
}

func s3Config(srv *s3server.Server, prefix string) backupstore.S3Config {
	return backupstore.S3Config{Endpoint: srv.Endpoint, Bucket: "backups", Region: "us-east-1", Prefix: prefix,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
}

// s3Target creates the credential Secret (the one name the managers' Role
// lets them read, so one such target at a time) and a BackupTarget polled
// every 2 s, both deleted when the test ends.
func s3Target(t *testing.T, name, url string, secret map[string]string) {
	t.Helper()
	ctx := context.Background()
	_, err := env.adminKube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: types.BackupCredentialsSecret, Namespace: ns}, StringData: secret}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminKube.CoreV1().Secrets(ns).Delete(ctx, types.BackupCredentialsSecret, metav1.DeleteOptions{})
	})
	createTarget(t, name, url, types.BackupCredentialsSecret)
}

// createTarget creates a BackupTarget polled every 2 s, deleted when the
// test ends.
func createTarget(t *testing.T, name, url, secret string) {
	t.Helper()
	ctx := context.Background()
	_, err := env.adminStrata.StrataV1beta1().BackupTargets(ns).Create(ctx, &v1beta1.BackupTarget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1beta1.BackupTargetSpec{BackupTargetURL: url, CredentialSecret: secret,
			PollInterval: metav1.Duration{Duration: 2 * time.Second}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminStrata.StrataV1beta1().BackupTargets(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// forbiddenCredentialSecret is a Secret name the managers' Role does not
// list: a target naming it says so (and the audit check expects the
// denial).
const forbiddenCredentialSecret = "e2e-unlisted-credentials"

func waitTarget(t *testing.T, name string, available bool, msg string) {
	t.Helper()
	var last string
	require.Eventually(t, func() bool {
		bt, err := env.adminStrata.StrataV1beta1().BackupTargets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		cond := meta.FindStatusCondition(bt.Status.Conditions, backup.ConditionTypeAvailable)
		if cond == nil {
			return false
		}
		last = cond.Message
		return bt.Status.Available == available && bytes.Contains([]byte(cond.Message), []byte(msg))
	}, time.Minute, 200*time.Millisecond, "backup target %s available=%t with %q (last message %q)", name, available, msg, last)
}

// A cluster pointed at a target an older cluster wrote lists its backups;
// the target turns unavailable when its S3 server stops, and available
// again when it is back; wrong credentials are said so, and so is a
// credential Secret the managers may not read.
func TestBackupTargetListsAnOldTargetAndReportsAvailability(t *testing.T) {
	ctx := context.Background()
	srv := startS3(t)
	store, err := backupstore.NewS3Store(s3Config(srv, "old-cluster"))
	require.NoError(t, err)
	old, err := backupstore.Open(ctx, store, backupstore.Options{})
	require.NoError(t, err)
	data := bytes.Repeat([]byte("an older cluster's volume "), 100000)
	_, err = old.Backup(ctx, backupstore.BackupInput{Volume: "e2e-old-vol", Backup: "e2e-old-bk", Snapshot: "snap-1",
		Size: int64(len(data)), Source: bytes.NewReader(data), Labels: map[string]string{"app": "db"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminStrata.StrataV1beta1().Backups(ns).Delete(ctx, "e2e-old-bk", metav1.DeleteOptions{})
		_ = env.adminStrata.StrataV1beta1().BackupVolumes(ns).Delete(ctx, "e2e-old-vol", metav1.DeleteOptions{})
	})

	creds := map[string]string{backupstore.SecretEndpoint: srv.Endpoint, backupstore.SecretAccessKey: srv.AccessKey,
		backupstore.SecretSecretKey: srv.SecretKey}
	s3Target(t, "e2e-s3", "s3://backups@us-east-1/old-cluster", creds)
	waitTarget(t, "e2e-s3", true, "listed")
	require.Eventually(t, func() bool {
		bk, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(ctx, "e2e-old-bk", metav1.GetOptions{})
		return err == nil && bk.Status.State == v1beta1.BackupStateCompleted && bk.Status.VolumeName == "e2e-old-vol" &&
			bk.Status.SnapshotName == "snap-1" && bk.Status.VolumeSize == int64(len(data))
	}, time.Minute, 200*time.Millisecond, "the old target's backup is listed as a Completed Backup")
	bv, err := env.adminStrata.StrataV1beta1().BackupVolumes(ns).Get(ctx, "e2e-old-vol", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, "e2e-old-bk", bv.Status.LastBackupName)
	require.Contains(t, kubectl(t, "-n", ns, "get", "bk", "e2e-old-bk"), "Completed")

	require.NoError(t, srv.Stop())
	waitTarget(t, "e2e-s3", false, "connection refused")
	require.NoError(t, srv.Restart())
	waitTarget(t, "e2e-s3", true, "listed")
	bk, err := env.adminStrata.StrataV1beta1().Backups(ns).Get(ctx, "e2e-old-bk", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, v1beta1.BackupStateCompleted, bk.Status.State, "an outage changes nothing listed before")

	// Wrong credentials are said so.
	secret, err := env.adminKube.CoreV1().Secrets(ns).Get(ctx, types.BackupCredentialsSecret, metav1.GetOptions{})
	require.NoError(t, err)
	secret.Data[backupstore.SecretSecretKey] = []byte("wrong")
	_, err = env.adminKube.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{})
	require.NoError(t, err)
	waitTarget(t, "e2e-s3", false, "the credentials are refused")

	// A Secret the managers' Role does not name: forbidden, with the fix.
	createTarget(t, "e2e-s3-unlisted", "s3://backups@us-east-1/old-cluster", forbiddenCredentialSecret)
	waitTarget(t, "e2e-s3-unlisted", false, `add "`+forbiddenCredentialSecret+`" to the resourceNames`)
	bt, err := env.adminStrata.StrataV1beta1().BackupTargets(ns).Get(ctx, "e2e-s3-unlisted", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, backup.BackupTargetReasonForbidden, meta.FindStatusCondition(bt.Status.Conditions, backup.ConditionTypeAvailable).Reason)
}

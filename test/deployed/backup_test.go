package deployed

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/runlocal"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Backups on the install: the managers' Pods read the credential Secret
// and reach a real S3 server (versitygw); a claim's files go to it as a
// Backup and come back as a new claim of a StorageClass restoring it, read
// by a Pod on another node.
func testBackupRestoredIntoANewClaim(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	s3, err := runlocal.StartBackupTarget(ctx, logrus.New(), env.cluster, env.root, t.TempDir())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s3.Stop() })
	t.Cleanup(func() {
		_, _ = kubectlOut(ctx, "-n", ns, "delete", "backups", "--all", "--timeout=60s")
		_, _ = kubectlOut(ctx, "-n", ns, "delete", "backuptarget", "default", "--timeout=60s")
	})
	kubectl(t, "-n", ns, "wait", "--for=condition=Available", "backuptarget/default", "--timeout=60s")

	claim(t, "bk-src", "")
	pod(t, "bk-src", "127.0.0.1", "bk-src", "for i in 1 2 3; do dd if=/dev/urandom of=/data/f$i bs=64k count=16 2>/dev/null; done; sync; exec sleep 3600")
	digest := "cd /data && sha256sum f1 f2 f3"
	var before string
	require.Eventually(t, func() bool {
		out, err := tryExecIn(podNamespace, "bk-src", digest)
		before = out
		return err == nil
	}, time.Minute, 200*time.Millisecond, "the files are written")
	volume := volumeOfClaim(t, "bk-src")

	// Issue 43: a file written with a plain echo (no fsync) just before the
	// backup is in it: its snapshot is cut inside a freeze of the claim's
	// filesystem.
	exec1(t, "bk-src", "echo unsynced > /data/late")
	start := time.Now()
	apply(t, fmt.Sprintf(`apiVersion: strata.io/v1beta1
kind: Backup
metadata: {name: bk-1, namespace: %s, labels: {strata.io/volume: %s}}`, ns, volume))
	require.Eventually(t, func() bool {
		b, err := env.strata.StrataV1beta1().Backups(ns).Get(ctx, "bk-1", metav1.GetOptions{})
		require.False(t, err == nil && b.Status.State == v1beta1.BackupStateError, "backup failed: %s", b.Status.Error)
		return err == nil && b.Status.State == v1beta1.BackupStateCompleted
	}, 2*time.Minute, 250*time.Millisecond, "backup completed")
	t.Logf("backup of a claim in use: %s", time.Since(start).Round(time.Millisecond))
	// The same backup through kubectl strata: listed, and restored into a
	// volume of its own.
	lines := plugin(t, "backup", "ls")
	require.Regexp(t, `^NAME\s+VOLUME\s+SNAPSHOT\s+STATE\s+SIZE\s+AGE$`, lines[0])
	assert.True(t, slicesMatch(lines[1:], `^bk-1\s+`+volume+`\s+\S+\s+Completed\s+\S+\s+\S+$`), "the backup's row")
	t.Cleanup(func() { _, _ = kubectlOut(ctx, "-n", ns, "delete", "volume", "bk-plugin", "--wait=false") })
	assert.Equal(t, []string{"volume/bk-plugin restoring from backup/bk-1", "volume/bk-plugin: restore completed"},
		plugin(t, "backup", "restore", "bk-1", "bk-plugin", "--wait"))
	assert.Equal(t, "bk-1", getVolume(t, "bk-plugin").Spec.FromBackup)

	apply(t, `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: strata-from-bk-1}
provisioner: driver.strata.io
parameters: {numberOfReplicas: "2", fromBackup: bk-1}`)
	t.Cleanup(func() { _, _ = kubectlOut(ctx, "delete", "storageclass", "strata-from-bk-1") })
	apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bk-restored, namespace: %s}
spec: {storageClassName: strata-from-bk-1, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}`, podNamespace))
	t.Cleanup(func() {
		_, _ = kubectlOut(ctx, "-n", podNamespace, "delete", "pvc", "bk-restored", "--wait=false")
	})
	pod(t, "bk-restored", "127.0.0.3", "bk-restored", "exec sleep 3600")
	assert.Equal(t, before, exec1(t, "bk-restored", digest), "the restored claim holds the backed-up files")
	assert.Equal(t, "unsynced", exec1(t, "bk-restored", "cat /data/late"), "and the file written just before the backup")
}

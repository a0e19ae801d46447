package e2e

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The CA is rotated while a Pod writes to a claim (issue 24): the Pod sees
// no I/O error, every node's instance manager moves to a certificate of the
// new CA, connections made after the rotation work (an instance manager
// restarted afterwards has its replica rebuilt by the engine, which dials
// it with the new certificates), and every chunk the Pod wrote reads back
// with the checksum it had when written.
func TestCertificateRotationWhileAPodWrites(t *testing.T) {
	ctx := context.Background()
	pvc := createPVC(t, "rotate", "64Mi")
	// Chunks of 256 KiB, each fsynced and its checksum recorded, until told
	// to stop; a failed write ends the container, which the test notices.
	writer := podWithClaim("rotate-writer", "127.0.0.2", pvc.Name, `set -e
i=0
while [ ! -e /data/stop ] && [ $i -lt 160 ]; do
  dd if=/dev/urandom of=/data/chunk-$i bs=64k count=4 conv=fsync 2>/dev/null
  sha256sum /data/chunk-$i >> /data/sums
  sync
  i=$((i+1))
  sleep 0.2
done
touch /data/done
sleep 3600`)
	createPod(t, writer)
	waitPodRunning(t, writer.Name)
	volume := getVolumeOfClaim(t, pvc.Name)
	engineNode := getVolume(t, volume).Status.CurrentNodeID
	require.Equal(t, "node-2", engineNode)

	secrets := env.adminKube.CoreV1().Secrets(ns)
	secret, err := secrets.Get(ctx, pki.CASecretName, metav1.GetOptions{})
	require.NoError(t, err)
	old, err := pki.ParseCAState(secret.Data)
	require.NoError(t, err)
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations[pki.AnnotationRotateCA] = "e2e"
	_, err = secrets.Update(ctx, secret, metav1.UpdateOptions{})
	require.NoError(t, err)
	start := time.Now()

	var current *x509.Certificate
	require.Eventually(t, func() bool {
		s, err := secrets.Get(ctx, pki.CASecretName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		st, err := pki.ParseCAState(s.Data)
		if err != nil || st.Current.Cert.Equal(old.Current.Cert) || st.Next != nil {
			return false
		}
		current = st.Current.Cert
		return true
	}, 2*time.Minute, 200*time.Millisecond, "the new CA is promoted")
	for _, node := range nodeNames {
		dir := env.managerOpts.TLSDir(node)
		require.Eventually(t, func() bool {
			cert, _, err := pki.ReadDir(dir)
			return err == nil && cert.Leaf.CheckSignatureFrom(current) == nil
		}, time.Minute, 200*time.Millisecond, "%s's instance manager holds a certificate of the new CA", node)
	}
	t.Logf("CA rotated and every instance manager re-issued in %s", time.Since(start).Round(time.Millisecond))

	// New connections after the rotation: the instance manager of the node
	// holding the other replica restarts; the engine rebuilds its replica.
	other := ""
	for _, n := range holdersOf(t, volume) {
		if n != engineNode {
			other = n
		}
	}
	require.NotEmpty(t, other, "a replica on another node than the engine's")
	restart := killIM(t, other)
	restart()
	waitVolume(t, volume, 3*time.Minute, "healthy again after the rebuild", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy && len(holdersOf(t, volume)) == 2
	})

	kubectl(t, "-n", podNamespace, "exec", writer.Name, "--", "touch", "/data/stop")
	require.Eventually(t, func() bool {
		_, err := tryKubectl(t, "-n", podNamespace, "exec", writer.Name, "--", "test", "-e", "/data/done")
		return err == nil
	}, time.Minute, 200*time.Millisecond, "the writer finished")
	pod, err := env.adminKube.CoreV1().Pods(podNamespace).Get(ctx, writer.Name, metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, corev1.PodRunning, pod.Status.Phase, "no write failed (the script stops at the first error)")
	out := kubectl(t, "-n", podNamespace, "exec", writer.Name, "--", "sha256sum", "-c", "/data/sums")
	chunks := strings.Count(out, ": OK")
	assert.NotContains(t, out, "FAILED")
	assert.Greater(t, chunks, 10, "the Pod wrote through the rotation")
	t.Logf("%d chunks written and verified across the rotation and the rebuild", chunks)
	deletePod(t, writer.Name)
}

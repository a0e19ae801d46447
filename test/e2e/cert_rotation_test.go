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

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/pki"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The CA is rotated while a Pod writes to a claim (issue 24): the Pod sees
// no I/O error, every node's instance manager moves to a certificate of the
// new CA, connections made after the rotation work (a manager certificate
// of the new CA reaches every instance manager; a new volume's engine dials
// its replicas with the new certificates), and every chunk the Pod wrote
// reads back with the checksum it had when written. It runs beside the
// other tests, as a rotation in production would.
func TestCertificateRotationWhileAPodWrites(t *testing.T) {
	t.Parallel()
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
	require.Equal(t, "node-2", getVolume(t, volume).Status.CurrentNodeID)

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

	// New connections after the rotation: gRPC with a manager certificate
	// of the new CA to every instance manager, and a new volume whose
	// engine dials its replicas on two nodes.
	manager := identityFromSecret(t, pki.ComponentManager)
	issued, err := manager.Certificate()
	require.NoError(t, err)
	require.NoError(t, issued.Leaf.CheckSignatureFrom(current), "issued by the new CA")
	for _, node := range nodeNames {
		c, err := engineapi.NewClient(env.managers[node].IM.GRPCAddr, 10*time.Second, pki.ClientConfig(manager, pki.ComponentInstanceManager))
		require.NoError(t, err)
		_, err = c.InstanceList(ctx)
		c.Close()
		require.NoError(t, err, "%s's instance manager takes a certificate of the new CA", node)
	}
	const fresh = "e2e-rotated"
	createVolume(t, fresh, "16Mi", 2)
	waitVolume(t, fresh, time.Minute, "detached", isDetached)
	updateTickets(t, fresh, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, fresh, time.Minute, "served on node-1", servedOn("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x3c 0 4M", "flush", "read -P 0x3c 0 4M")
	waitVolume(t, fresh, time.Minute, "healthy", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy
	})
	updateTickets(t, fresh, removeTicket("admin"))

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
	t.Logf("%d chunks written and verified across the rotation", chunks)
	deletePod(t, writer.Name)
}

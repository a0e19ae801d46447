package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The user's path: a PVC of the default StorageClass is provisioned by
// csi-provisioner, a Pod using it is scheduled, the attach-detach controller's
// VolumeAttachment is attached by csi-attacher through a Strata ticket, the
// kubelet stages and publishes it through the node plugin, the Pod writes;
// the Pod moves to another node and reads the same data; deleting the PVC
// deletes the volume.
func TestPVCUsedByPodsOnTwoNodes(t *testing.T) {
	t.Parallel() // Pods and claims of its own, no fault: waits beside the others at the end
	ctx := context.Background()
	start := time.Now()
	pvc := createPVC(t, "data", "64Mi")
	var bound *corev1.PersistentVolumeClaim
	var err error
	require.Eventually(t, func() bool {
		bound, err = env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, pvc.Name, metav1.GetOptions{})
		return err == nil && bound.Status.Phase == corev1.ClaimBound
	}, 2*time.Minute, 100*time.Millisecond, "PVC Bound")
	t.Logf("PVC create→Bound: %s", time.Since(start).Round(time.Millisecond))
	pv, err := env.adminKube.CoreV1().PersistentVolumes().Get(ctx, bound.Spec.VolumeName, metav1.GetOptions{})
	require.NoError(t, err)
	volume := pv.Spec.CSI.VolumeHandle
	assert.Equal(t, "data", getVolume(t, volume).Annotations["strata.io/pvc-name"], "the volume names its claim")
	t.Cleanup(func() { // before createPVC's cleanup: the claim goes first
		_ = env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{})
		waitVolumeGone(t, volume)
	})

	writer := podWithClaim("writer", "127.0.0.2", pvc.Name,
		"cat /proc/sys/kernel/random/uuid > /data/token; sync; sleep 3600")
	created := createPod(t, writer)
	running := waitPodRunning(t, writer.Name)
	t.Logf("Pod with a PVC create→Running: %s", running.Sub(created).Round(time.Millisecond))
	token := strings.TrimSpace(kubectl(t, "-n", podNamespace, "exec", writer.Name, "--", "cat", "/data/token"))
	require.NotEmpty(t, token)
	assert.Equal(t, "node-2", getVolume(t, volume).Status.CurrentNodeID, "attached where the Pod runs")
	deletePod(t, writer.Name)

	reader := podWithClaim("reader", "127.0.0.3", pvc.Name, "sleep 3600")
	createPod(t, reader)
	waitPodRunning(t, reader.Name)
	assert.Equal(t, token, strings.TrimSpace(kubectl(t, "-n", podNamespace, "exec", reader.Name, "--", "cat", "/data/token")),
		"the data written on the other node")
	assert.Equal(t, "node-3", getVolume(t, volume).Status.CurrentNodeID)

	// A VolumeSnapshot of the claim in use: csi-snapshotter makes it a
	// Strata snapshot; deleting it (Delete policy) removes that snapshot.
	start = time.Now()
	createVolumeSnapshot(t, "data-snap", "data")
	t.Logf("VolumeSnapshot create→readyToUse: %s", time.Since(start).Round(time.Millisecond))
	handle := kubectl(t, "get", "volumesnapshotcontent", "-o",
		"jsonpath={.items[?(@.spec.volumeSnapshotRef.name==\"data-snap\")].status.snapshotHandle}")
	require.NotEmpty(t, handle)
	snap, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
	require.NoError(t, err, "the Strata snapshot behind the VolumeSnapshot")
	assert.Equal(t, volume, snap.Spec.Volume)
	kubectl(t, "-n", podNamespace, "delete", "volumesnapshot", "data-snap", "--wait=true", "--timeout=60s")
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "the Strata snapshot goes with the VolumeSnapshot (Delete policy)")
	deletePod(t, reader.Name)

	require.NoError(t, env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, err := env.adminKube.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 200*time.Millisecond, "the PV is deleted")
	waitVolumeGone(t, volume)
}

func podWithClaim(name, node, claim, script string) *corev1.Pod {
	pod := workloadPod(name, node, script)
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	pod.Spec.TerminationGracePeriodSeconds = ptr.To(int64(1))
	return pod
}

func kubectlApply(t *testing.T, manifest string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	require.NoError(t, os.WriteFile(path, []byte(manifest), 0o644))
	kubectl(t, "apply", "-f", path)
}

// createPVC creates a claim of the default StorageClass, deleted when the
// test ends.
func createPVC(t *testing.T, name, size string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return createClaimWith(t, name, size, nil)
}

// createClaimWith creates a ReadWriteOnce claim of the default StorageClass
// as edit leaves it, deleted when the test ends.
func createClaimWith(t *testing.T, name, size string, edit func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if edit != nil {
		edit(pvc)
	}
	_, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Create(context.Background(), pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return pvc
}

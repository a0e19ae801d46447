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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
)

// Claims and Pods as the process-mode tests make them (the user flows with
// claims and Pods run on the install: test/deployed), and what a claim
// leaves on a node.

// podWithClaim is a workload Pod on node with the claim at /data.
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

// volumesOfClaim lists the Strata volumes the CSI driver made for the claim.
func volumesOfClaim(t *testing.T, claim string) []string {
	t.Helper()
	volumes, err := localcluster.VolumesOfClaim(context.Background(), env.adminStrata, ns, podNamespace, claim)
	require.NoError(t, err)
	return volumes
}

func waitVolumeSnapshotReady(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	var last string
	for time.Since(start) < timeout {
		out, err := tryKubectl(t, "-n", podNamespace, "get", "volumesnapshot", name, "-o", "jsonpath={.status}")
		last = out
		if err == nil && strings.Contains(out, `"readyToUse":true`) {
			t.Logf("VolumeSnapshot %s readyToUse after %s", name, time.Since(start).Round(time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("VolumeSnapshot %s not readyToUse within %s; last status: %s", name, timeout, last)
}

// assertNoTraceOfVolume checks the node holds nothing of the volume once it
// is gone: no mount of its connection or of the kubelet's CSI paths, no
// nbdfuse serving it, no loop device of it that was not there before the
// test.
func assertNoTraceOfVolume(t *testing.T, node *localcluster.Node, volume string, loopsBefore map[string]string) {
	t.Helper()
	traces := localcluster.VolumeTraces{Volume: volume, KubeletRoot: node.KubeletRoot(), LoopsBefore: loopsBefore,
		Dirs: []string{node.CSIStateDir() + "/" + volume}}
	var left []string
	ok := assert.Eventually(t, func() bool {
		left = traces.Left()
		return len(left) == 0
	}, 30*time.Second, 250*time.Millisecond, "nothing of volume %s left on %s", volume, node.Name)
	if !ok {
		t.Logf("left on %s: %s", node.Name, strings.Join(left, "; "))
	}
}

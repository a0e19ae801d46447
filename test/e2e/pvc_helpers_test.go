package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/strata-storage/strata/csi"
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

// volumesOfClaim lists the Strata volumes the CSI driver made for the claim
// (named in their strata.io/pvc-name annotation).
func volumesOfClaim(t *testing.T, claim string) []string {
	t.Helper()
	list, err := env.adminStrata.StrataV1beta1().Volumes(ns).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []string
	for _, v := range list.Items {
		if v.Annotations[csi.AnnotationPVCName] == claim && v.Annotations[csi.AnnotationPVCNamespace] == podNamespace {
			out = append(out, v.Name)
		}
	}
	return out
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
	stateDir := node.CSIStateDir() + "/" + volume
	kubeletCSI := node.KubeletRoot() + "/plugins/kubernetes.io/csi"
	sum := sha256.Sum256([]byte(volume))
	handleHash := hex.EncodeToString(sum[:])
	var left []string
	ok := assert.Eventually(t, func() bool {
		left = nil
		left = append(left, localcluster.MountsUnder(stateDir)...)
		// The kubelet's paths of this volume: named for the PV (block) or
		// for the SHA-256 of the volume handle (a filesystem's staging).
		for _, m := range localcluster.MountsUnder(kubeletCSI) {
			if strings.Contains(m, volume) || strings.Contains(m, handleHash) {
				left = append(left, m)
			}
		}
		for i := range left {
			left[i] = "mount " + left[i]
		}
		for dev, file := range localcluster.LoopDevices() {
			// Only this volume's: tests running beside this one make their
			// own (the plugin's under their state directory, the kubelet's
			// for a block volume under a path named for the PV, which is
			// named like the volume).
			ours := strings.HasPrefix(file, stateDir+"/") || strings.Contains(file, volume)
			if was, ok := loopsBefore[dev]; ours && (!ok || was != file) {
				left = append(left, "loop device "+dev+" on "+file)
			}
		}
		for _, p := range nbdfuseProcesses(stateDir) {
			left = append(left, "nbdfuse "+p)
		}
		return len(left) == 0
	}, 30*time.Second, 250*time.Millisecond, "nothing of volume %s left on %s", volume, node.Name)
	if !ok {
		t.Logf("left on %s: %s", node.Name, strings.Join(left, "; "))
	}
}

// nbdfuseProcesses lists the command lines of the nbdfuse processes that
// mount dir.
func nbdfuseProcesses(dir string) []string {
	var out []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != "nbdfuse" {
			continue
		}
		for _, a := range args[1:] {
			if a == dir || a == dir+"/" {
				out = append(out, strings.Join(args, " "))
				break
			}
		}
	}
	return out
}

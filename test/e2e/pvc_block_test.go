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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/internal/localcluster"
)

// blockDevicePath is where the block-mode Pods see their claim.
const blockDevicePath = "/dev/xvda"

// A claim in volumeMode Block: a Pod on 127.0.0.2 sees a block device at its
// devicePath, 8 MiB of random data written with O_DIRECT and fsync reads back
// with the same checksum, and a Pod on 127.0.0.3 reads the same checksum
// after the volume moved there. Deleting the claim deletes the volume and
// leaves no mount, loop device or nbdfuse process behind.
func TestPVCBlockModeOnTwoNodes(t *testing.T) {
	t.Parallel() // Pods and claims of its own, no fault: waits beside the others at the end
	ctx := context.Background()
	loopsBefore := localcluster.LoopDevices()
	pvc := createClaimWith(t, "block-data", "64Mi", func(c *corev1.PersistentVolumeClaim) {
		c.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	})
	volume := boundVolume(t, pvc)
	bound, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, pvc.Name, metav1.GetOptions{})
	require.NoError(t, err)
	pv, err := env.adminKube.CoreV1().PersistentVolumes().Get(ctx, bound.Spec.VolumeName, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, pv.Spec.VolumeMode)
	assert.Equal(t, corev1.PersistentVolumeBlock, *pv.Spec.VolumeMode, "the PV is a block volume")
	assert.Equal(t, pvc.Name, getVolume(t, volume).Annotations[csi.AnnotationPVCName])

	writer := blockPod("block-writer", "127.0.0.2", pvc.Name)
	created := createPod(t, writer)
	running := waitPodRunning(t, writer.Name)
	t.Logf("block Pod create→Running: %s", running.Sub(created).Round(time.Millisecond))
	exec := func(pod, script string) string {
		return strings.TrimSpace(kubectl(t, "-n", podNamespace, "exec", pod, "--", "sh", "-c", script))
	}
	exec(writer.Name, "test -b "+blockDevicePath) // fails the test unless it is a block device
	size := exec(writer.Name, "blockdev --getsize64 "+blockDevicePath)
	assert.Equal(t, "67108864", size, "the device has the claim's size")

	const readBack = "dd if=" + blockDevicePath + " bs=1M count=8 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1"
	written := exec(writer.Name, "dd if=/dev/urandom of=/tmp/data bs=1M count=8 2>/dev/null && "+
		"dd if=/tmp/data of="+blockDevicePath+" bs=1M oflag=direct conv=fsync 2>/dev/null && sha256sum /tmp/data | cut -d' ' -f1")
	require.Len(t, written, 64, "a sha256 of the written data: %q", written)
	zeros := sha256.Sum256(make([]byte, 8<<20))
	require.NotEqual(t, hex.EncodeToString(zeros[:]), written, "random data was written, not zeros")
	assert.Equal(t, written, exec(writer.Name, readBack), "the data reads back through the device")
	assert.Equal(t, "node-2", getVolume(t, volume).Status.CurrentNodeID, "attached where the Pod runs")
	deletePod(t, writer.Name)

	reader := blockPod("block-reader", "127.0.0.3", pvc.Name)
	createPod(t, reader)
	waitPodRunning(t, reader.Name)
	exec(reader.Name, "test -b "+blockDevicePath)
	assert.Equal(t, written, exec(reader.Name, readBack), "the data written on the other node")
	assert.Equal(t, "node-3", getVolume(t, volume).Status.CurrentNodeID)
	deletePod(t, reader.Name)

	require.NoError(t, env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, err := env.adminKube.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 200*time.Millisecond, "the PV is deleted")
	waitVolumeGone(t, volume)
	assert.Empty(t, volumesOfClaim(t, pvc.Name), "no volume of the claim is left")
	for _, i := range []int{1, 2} {
		assertNoTraceOfVolume(t, env.cluster.Nodes()[i], volume, loopsBefore)
	}
}

// blockPod is a Pod that uses the claim as a raw block device at
// blockDevicePath.
func blockPod(name, node, claim string) *corev1.Pod {
	pod := workloadPod(name, node, "sleep 3600")
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	pod.Spec.Containers[0].VolumeDevices = []corev1.VolumeDevice{{Name: "data", DevicePath: blockDevicePath}}
	return pod
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

package deployed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A claim's life on the install, as a user has it (moved from test/e2e):
// used by Pods on two nodes, as a block device, grown while its Pod runs.

// The user's path: a claim of the default StorageClass is provisioned by
// the chart's csi-provisioner, a Pod using it is scheduled, the
// attach-detach controller's VolumeAttachment is attached by csi-attacher
// through a Strata ticket, the kubelet stages and publishes it through the
// node plugin's Pod, the Pod writes; the Pod moves to another node and
// reads the same data. A VolumeSnapshot of the claim in use is a Strata
// snapshot that goes with it (Delete policy); deleting the claim deletes
// its PV and its volume.
func testPVCUsedByPodsOnTwoNodes(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	const name = "two-nodes"
	start := time.Now()
	claim(t, name, "")
	volume := volumeOfClaim(t, name) // the PV's name and the volume's
	t.Logf("PVC create→Bound: %s", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, name, getVolume(t, volume).Annotations[csi.AnnotationPVCName], "the volume names its claim")

	start = time.Now()
	pod(t, name+"-writer", "127.0.0.2", name, "cat /proc/sys/kernel/random/uuid > /data/token; sync; exec sleep 3600")
	t.Logf("Pod with a PVC create→Running: %s", time.Since(start).Round(time.Millisecond))
	var token string
	require.Eventually(t, func() bool {
		out, err := tryExecIn(podNamespace, name+"-writer", "cat /data/token")
		token = out
		return err == nil && out != ""
	}, time.Minute, 200*time.Millisecond, "the Pod wrote its token")
	assert.Equal(t, "127.0.0.2", getVolume(t, volume).Status.CurrentNodeID, "attached where the Pod runs")
	deletePod(t, name+"-writer")

	pod(t, name+"-reader", "127.0.0.3", name, "exec sleep 3600")
	assert.Equal(t, token, exec1(t, name+"-reader", "cat /data/token"), "the data written on the other node")
	assert.Equal(t, "127.0.0.3", getVolume(t, volume).Status.CurrentNodeID)

	start = time.Now()
	createVolumeSnapshot(t, name+"-snap", name)
	waitVolumeSnapshotReady(t, podNamespace, name+"-snap")
	t.Logf("VolumeSnapshot create→readyToUse: %s", time.Since(start).Round(time.Millisecond))
	content := kubectl(t, "-n", podNamespace, "get", "volumesnapshot", name+"-snap", "-o", "jsonpath={.status.boundVolumeSnapshotContentName}")
	require.NotEmpty(t, content)
	handle := kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.status.snapshotHandle}")
	require.NotEmpty(t, handle)
	snap, err := env.strata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
	require.NoError(t, err, "the Strata snapshot behind the VolumeSnapshot")
	assert.Equal(t, volume, snap.Spec.Volume)
	kubectl(t, "-n", podNamespace, "delete", "volumesnapshot", name+"-snap", "--wait=true", "--timeout=60s")
	require.Eventually(t, func() bool {
		_, err := env.strata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "the Strata snapshot goes with the VolumeSnapshot (Delete policy)")
	deletePod(t, name+"-reader")

	deleteClaimAndItsVolume(t, name, volume)
}

// deleteClaimAndItsVolume deletes the claim as a user does and waits until
// its PV (named like the volume) and its Strata volume are gone.
func deleteClaimAndItsVolume(t *testing.T, claimName, volume string) {
	t.Helper()
	kubectl(t, "-n", podNamespace, "delete", "pvc", claimName, "--wait=false")
	require.Eventually(t, func() bool {
		_, err := env.kube.CoreV1().PersistentVolumes().Get(context.Background(), volume, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, 2*time.Minute, 200*time.Millisecond, "the PV %s is deleted", volume)
	waitVolumeGone(t, volume)
}

// A claim in volumeMode Block: a Pod on 127.0.0.2 sees a block device at
// its devicePath, 8 MiB of random data written with O_DIRECT and fsync
// read back with the same checksum, and a Pod on 127.0.0.3 reads the same
// checksum after the volume moved there. Deleting the claim deletes the
// volume and leaves no mount, loop device or nbdfuse process of it on
// either node.
func testPVCBlockModeOnTwoNodes(t *testing.T) {
	logsOnFailure(t)
	const name = "blk"
	loopsBefore := localcluster.LoopDevices()
	claimIn(t, podNamespace, name, "64Mi", "volumeMode: Block")
	volume := volumeOfClaim(t, name)
	pv, err := env.kube.CoreV1().PersistentVolumes().Get(context.Background(), volume, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, pv.Spec.VolumeMode)
	assert.Equal(t, corev1.PersistentVolumeBlock, *pv.Spec.VolumeMode, "the PV is a block volume")
	assert.Equal(t, name, getVolume(t, volume).Annotations[csi.AnnotationPVCName])

	start := time.Now()
	podIn(t, podNamespace, name+"-writer", "127.0.0.2", name, "exec sleep 3600", true)
	t.Logf("block Pod create→Running: %s", time.Since(start).Round(time.Millisecond))
	exec1(t, name+"-writer", "test -b "+blockDevice) // fails the test unless it is a block device
	assert.Equal(t, "67108864", exec1(t, name+"-writer", "blockdev --getsize64 "+blockDevice), "the device has the claim's size")

	const readBack = "dd if=" + blockDevice + " bs=1M count=8 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1"
	written := exec1(t, name+"-writer", "dd if=/dev/urandom of=/tmp/data bs=1M count=8 2>/dev/null && "+
		"dd if=/tmp/data of="+blockDevice+" bs=1M oflag=direct conv=fsync 2>/dev/null && sha256sum /tmp/data | cut -d' ' -f1")
	require.Len(t, written, 64, "a sha256 of the written data: %q", written)
	zeros := sha256.Sum256(make([]byte, 8<<20))
	require.NotEqual(t, hex.EncodeToString(zeros[:]), written, "random data was written, not zeros")
	assert.Equal(t, written, exec1(t, name+"-writer", readBack), "the data reads back through the device")
	assert.Equal(t, "127.0.0.2", getVolume(t, volume).Status.CurrentNodeID, "attached where the Pod runs")
	deletePod(t, name+"-writer")

	podIn(t, podNamespace, name+"-reader", "127.0.0.3", name, "exec sleep 3600", true)
	exec1(t, name+"-reader", "test -b "+blockDevice)
	assert.Equal(t, written, exec1(t, name+"-reader", readBack), "the data written on the other node")
	assert.Equal(t, "127.0.0.3", getVolume(t, volume).Status.CurrentNodeID)
	deletePod(t, name+"-reader")

	deleteClaimAndItsVolume(t, name, volume)
	assert.Empty(t, volumesOfClaimIn(t, podNamespace, name), "no volume of the claim is left")
	for _, node := range []string{"127.0.0.2", "127.0.0.3"} {
		assertNoTraceOfVolume(t, node, volume, loopsBefore)
	}
}

// assertNoTraceOfVolume checks the node holds nothing of the volume once
// it is gone: no mount of the node plugin's state of it (the chart's
// hostDir/csi), of the instance manager's file of it (hostDir/fuse) or of
// the kubelet's CSI paths, no nbdfuse serving it, no loop device of it
// that was not there before the test.
func assertNoTraceOfVolume(t *testing.T, nodeName, volume string, loopsBefore map[string]string) {
	t.Helper()
	node := clusterNode(t, nodeName)
	traces := localcluster.VolumeTraces{Volume: volume, KubeletRoot: node.KubeletRoot(), LoopsBefore: loopsBefore,
		Dirs: []string{filepath.Join(node.StrataDir(), "csi", volume), filepath.Join(fuseDir(t, nodeName), volume)}}
	var left []string
	ok := assert.Eventually(t, func() bool {
		left = traces.Left()
		return len(left) == 0
	}, 30*time.Second, 250*time.Millisecond, "nothing of volume %s left on %s", volume, nodeName)
	if !ok {
		t.Logf("left on %s: %s", nodeName, strings.Join(left, "; "))
	}
}

// A claim grows while its Pod runs: csi-resizer calls
// ControllerExpandVolume (the engine and replicas grow online), the kubelet
// calls NodeExpandVolume through the node plugin's Pod (the loop device
// follows the instance manager's file, xfs_growfs grows the mounted
// filesystem). The Pod is never restarted, its data stays, and it can fill
// the new space. XFS because growing a mounted ext4 needs
// CAP_SYS_RESOURCE, which root on these machines lacks; an ext4 claim
// grows at its next staging instead (resize2fs before the mount), shown
// second.
func testPVCResizeWhilePodRuns(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	xfs := xfsClass(t, "grow")
	tests := []struct {
		name, class, node  string
		before, after      string
		restartBeforeCheck bool // ext4: the filesystem grows at the next staging
	}{
		{name: "xfs, online", class: xfs, node: "127.0.0.1", before: "320Mi", after: "448Mi"},
		{name: "ext4, at the next staging", class: "strata", node: "127.0.0.2", before: "64Mi", after: "128Mi", restartBeforeCheck: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "grow-" + strconv.Itoa(i)
			claimIn(t, podNamespace, name, tc.before, "storageClassName: "+tc.class)
			volume := volumeOfClaim(t, name)
			pod(t, name, tc.node, name, "dd if=/dev/urandom of=/data/before bs=1M count=16 && sync && exec sleep 3600")
			require.Eventually(t, func() bool {
				_, err := tryExecIn(podNamespace, name, "test -s /data/before")
				return err == nil
			}, time.Minute, 200*time.Millisecond, "the Pod wrote /data/before")
			sum := func(pod string) string { return exec1(t, pod, "sha256sum /data/before") }
			sumBefore := sum(name)
			dfBefore, err := dfKiB(name)
			require.NoError(t, err)
			container := containerID(t, name)

			start := time.Now()
			patch := `{"spec":{"resources":{"requests":{"storage":"` + tc.after + `"}}}}`
			_, err = env.kube.CoreV1().PersistentVolumeClaims(podNamespace).Patch(ctx, name, ktypes.MergePatchType,
				[]byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
			want, was := resource.MustParse(tc.after), resource.MustParse(tc.before)
			waitVolumeStatus(t, volume, 2*time.Minute, "replicas grown", func(v *v1beta1.Volume) bool {
				return v.Status.CurrentSize >= want.Value()
			})
			t.Logf("%s: PVC patched→volume grown: %s", tc.name, time.Since(start).Round(time.Millisecond))
			checkPod := name
			if tc.restartBeforeCheck {
				deletePod(t, name)
				checkPod = name + "-again"
				pod(t, checkPod, tc.node, name, "exec sleep 3600")
			}
			var dfNow int64
			require.Eventually(t, func() bool {
				p, err := env.kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
				if err != nil || p.Status.Capacity.Storage().Cmp(want) < 0 {
					return false
				}
				dfNow, err = dfKiB(checkPod)
				return err == nil && dfNow > dfBefore+(want.Value()-was.Value())/1024/2
			}, 3*time.Minute, time.Second, "the claim's capacity and the mounted filesystem grew")
			t.Logf("%s: PVC patched→filesystem grown in the Pod: %s (df %d KiB → %d KiB)",
				tc.name, time.Since(start).Round(time.Millisecond), dfBefore, dfNow)
			assert.Equal(t, sumBefore, sum(checkPod), "the data stays")
			if !tc.restartBeforeCheck {
				assert.Equal(t, container, containerID(t, name), "the Pod kept running")
			}
			// Fill more than there was room for before.
			fill := strconv.FormatInt(dfBefore/1024+8, 10)
			exec1(t, checkPod, "dd if=/dev/zero of=/data/more bs=1M count="+fill+" 2>&1 && sync")
		})
	}
}

// dfKiB is the size in KiB of the filesystem at /data in the Pod, as df
// shows it.
func dfKiB(pod string) (int64, error) {
	out, err := tryExecIn(podNamespace, pod, "df -k /data | tail -n 1")
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(out)
	if len(fields) < 2 {
		return 0, fmt.Errorf("df: %q", out)
	}
	return strconv.ParseInt(fields[1], 10, 64)
}

// containerID is the Pod's container's ID: a new one means the container
// restarted.
func containerID(t *testing.T, pod string) string {
	t.Helper()
	p, err := env.kube.CoreV1().Pods(podNamespace).Get(context.Background(), pod, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, p.Status.ContainerStatuses)
	return p.Status.ContainerStatuses[0].ContainerID
}

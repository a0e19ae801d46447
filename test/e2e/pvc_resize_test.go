package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// A PVC grows while its Pod runs: csi-resizer calls ControllerExpandVolume
// (the engine and replicas grow online), the kubelet calls NodeExpandVolume
// (the loop device follows the growable export, xfs_growfs grows the
// mounted filesystem). The Pod is never restarted, its data stays, and it
// can fill the new space. XFS because growing a mounted ext4 needs
// CAP_SYS_RESOURCE, which root on these machines lacks; an ext4 claim grows
// at its next staging instead (resize2fs before the mount), shown second.
func TestPVCResizeWhilePodRuns(t *testing.T) {
	t.Parallel() // Pods and claims of its own, no fault: waits beside the others at the end
	ctx := context.Background()
	kubectlApply(t, `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: strata-xfs}
provisioner: driver.strata.io
parameters: {numberOfReplicas: "2", csi.storage.k8s.io/fstype: xfs}
allowVolumeExpansion: true`)
	t.Cleanup(func() { _, _ = tryKubectl(t, "delete", "storageclass", "strata-xfs", "--ignore-not-found") })

	tests := []struct {
		name, class, node  string
		before, after      string
		restartBeforeCheck bool // ext4: the filesystem grows at the next staging
	}{
		{name: "xfs, online", class: "strata-xfs", node: "127.0.0.1", before: "320Mi", after: "448Mi"},
		{name: "ext4, at the next staging", class: "strata", node: "127.0.0.2", before: "64Mi", after: "128Mi", restartBeforeCheck: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			claim := "grow-" + strconv.Itoa(i)
			pvc := createClaimWith(t, claim, tc.before, func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = &tc.class })
			volume := boundVolume(t, pvc)
			pod := podWithClaim(claim, tc.node, claim, "dd if=/dev/urandom of=/data/before bs=1M count=16 && sync && sleep 3600")
			createPod(t, pod)
			waitPodRunning(t, claim)
			dfKiB := func(pod string) int64 {
				out := kubectl(t, "-n", podNamespace, "exec", pod, "--", "df", "-k", "/data")
				fields := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1])
				n, err := strconv.ParseInt(fields[1], 10, 64)
				require.NoError(t, err, "df: %s", out)
				return n
			}
			sum := func(pod string) string {
				return kubectl(t, "-n", podNamespace, "exec", pod, "--", "sha256sum", "/data/before")
			}
			require.Eventually(t, func() bool {
				_, err := tryKubectl(t, "-n", podNamespace, "exec", claim, "--", "test", "-s", "/data/before")
				return err == nil
			}, time.Minute, 200*time.Millisecond)
			sumBefore, dfBefore := sum(claim), dfKiB(claim)
			uid := getPod(t, claim).Status.ContainerStatuses[0].ContainerID

			start := time.Now()
			patch := `{"spec":{"resources":{"requests":{"storage":"` + tc.after + `"}}}}`
			_, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Patch(ctx, claim, types.MergePatchType,
				[]byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
			want, was := resource.MustParse(tc.after), resource.MustParse(tc.before)
			waitVolume(t, volume, 2*time.Minute, "replicas grown", func(v *v1beta1.Volume) bool {
				return v.Status.CurrentSize >= want.Value()
			})
			t.Logf("%s: PVC patched→volume grown: %s", tc.name, time.Since(start).Round(time.Millisecond))
			checkPod := claim
			if tc.restartBeforeCheck {
				deletePod(t, claim)
				checkPod = claim + "-again"
				createPod(t, podWithClaim(checkPod, tc.node, claim, "sleep 3600"))
				waitPodRunning(t, checkPod)
			}
			require.Eventually(t, func() bool {
				p, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, claim, metav1.GetOptions{})
				return err == nil && p.Status.Capacity.Storage().Cmp(want) >= 0 && dfKiB(checkPod) > dfBefore+(want.Value()-was.Value())/1024/2
			}, 3*time.Minute, time.Second, "the claim's capacity and the mounted filesystem grew")
			t.Logf("%s: PVC patched→filesystem grown in the Pod: %s (df %d KiB → %d KiB)",
				tc.name, time.Since(start).Round(time.Millisecond), dfBefore, dfKiB(checkPod))
			assert.Equal(t, sumBefore, sum(checkPod), "the data stays")
			if !tc.restartBeforeCheck {
				assert.Equal(t, uid, getPod(t, claim).Status.ContainerStatuses[0].ContainerID, "the Pod kept running")
			}
			// Fill more than there was room for before.
			fill := strconv.FormatInt(dfBefore/1024+8, 10)
			kubectl(t, "-n", podNamespace, "exec", checkPod, "--", "sh", "-c", "dd if=/dev/zero of=/data/more bs=1M count="+fill+" && sync")
		})
	}
}

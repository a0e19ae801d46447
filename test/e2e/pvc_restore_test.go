package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// aliceWriter fills the claim with a bulk file, then keeps adding small
// files to a tree, except while /tmp/pause exists: then it syncs and says
// so in /tmp/paused (the seed's "Alice pauses her database").
const aliceWriter = `mkdir -p /data/tree || exit 1
dd if=/dev/urandom of=/data/bulk bs=1M count=160 2>/dev/null || exit 1
i=0
while true; do
  if [ -f /tmp/pause ]; then
    if [ ! -f /tmp/paused ]; then sync; touch /tmp/paused; fi
    sleep 0.1; continue
  fi
  rm -f /tmp/paused
  if [ $i -lt 2000 ]; then # at most 32 MiB of small files: the claim has room
    i=$((i+1)); mkdir -p /data/tree/d$((i % 8))
    dd if=/dev/urandom of=/data/tree/d$((i % 8))/f$i bs=4k count=4 2>/dev/null || exit 1
  fi
  sleep 0.05
done`

// treeDigest lists every file under /data with its checksum, in order.
const treeDigest = `cd /data && find . -type f | sort | xargs sha256sum`

// createPVCFrom creates a claim of the default StorageClass filled from a
// data source (a VolumeSnapshot, or another claim when apiGroup is "").
func createPVCFrom(t *testing.T, name, size, apiGroup, kind, source string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return createClaimWith(t, name, size, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: kind, Name: source}
		if apiGroup != "" {
			c.Spec.DataSource.APIGroup = &apiGroup
		}
	})
}

// boundVolume waits for the claim to be bound and returns its Strata volume,
// which is waited gone on cleanup (after the claim's own cleanup ran).
func boundVolume(t *testing.T, pvc *corev1.PersistentVolumeClaim) string {
	t.Helper()
	volume := ""
	require.Eventually(t, func() bool {
		volume = getVolumeOfClaimOrEmpty(pvc.Name)
		return volume != ""
	}, 2*time.Minute, 200*time.Millisecond, "claim %s bound", pvc.Name)
	t.Cleanup(func() {
		_ = env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(context.Background(), pvc.Name, metav1.DeleteOptions{})
		waitVolumeGone(t, volume)
	})
	return volume
}

func getVolumeOfClaimOrEmpty(claim string) string {
	ctx := context.Background()
	pvc, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil || pvc.Status.Phase != corev1.ClaimBound {
		return ""
	}
	pv, err := env.adminKube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.CSI == nil {
		return ""
	}
	return pv.Spec.CSI.VolumeHandle
}

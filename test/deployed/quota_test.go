package deployed

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// The space-management seed's namespace quota on the install, met as a
// user meets it: a 10Mi quota, a 10Mi block claim written full by a Pod.
// The first VolumeSnapshot fits and the quota shows 10Mi used; with the
// claim written again the second is refused by the webhook with the
// figures; once the first is deleted a snapshot fits again.
func testQuotaRefusesAVolumeSnapshotOverTheNamespaceQuota(t *testing.T) {
	logsOnFailure(t)
	const wns = "quota-d"
	kubectl(t, "create", "namespace", wns)
	t.Cleanup(func() { _, _ = kubectlOut(context.Background(), "delete", "namespace", wns, "--wait=false") })
	apply(t, fmt.Sprintf(`apiVersion: strata.io/v1beta1
kind: ResourceQuota
metadata: {name: %s, namespace: %s}
spec: {snapshotLimit: {namespaceTotalSnapshotSizeQuota: 10Mi}}`, v1beta1.DefaultResourceQuotaName, wns))
	claimIn(t, wns, "data", "10Mi", "volumeMode: Block")
	podIn(t, wns, "writer", "127.0.0.2", "data", "exec sleep 3600", true)
	volume := volumeOfClaimIn(t, wns, "data")
	// The quota charges what the engine last reported of the head, so each
	// fill waits for the report, as the e2e quota tests do.
	fill := func() {
		execIn(t, wns, "writer", "dd if=/dev/urandom of="+blockDevice+" bs=1M count=10 oflag=direct conv=fsync 2>&1")
		require.Eventually(t, func() bool {
			engines, err := env.strata.StrataV1beta1().Engines(ns).List(context.Background(),
				metav1.ListOptions{LabelSelector: types.LabelVolume + "=" + volume})
			if err != nil || len(engines.Items) != 1 {
				return false
			}
			head := engines.Items[0].Status.Snapshots[types.VolumeHeadName]
			return head != nil && head.Size >= 10<<20
		}, time.Minute, 200*time.Millisecond, "the engine reports the head of %s full", volume)
	}

	fill()
	require.NoError(t, takeVolumeSnapshot(t, wns, "vs1", "data"))
	waitVolumeSnapshotReady(t, wns, "vs1")
	waitQuotaUsage(t, wns, 10<<20)

	fill()
	err := takeVolumeSnapshot(t, wns, "vs2", "data")
	require.Error(t, err, "a second 10Mi snapshot is over the 10Mi quota")
	for _, part := range []string{"snapshot space quota exceeded", "namespace " + wns, "hold 10Mi",
		"VolumeSnapshot " + wns + "/vs2 would add 10Mi", "quota of 10Mi"} {
		require.Contains(t, err.Error(), part)
	}

	kubectl(t, "-n", wns, "delete", "volumesnapshot", "vs1", "--timeout=2m")
	waitQuotaUsage(t, wns, 0)
	require.NoError(t, takeVolumeSnapshot(t, wns, "vs3", "data"))
	waitVolumeSnapshotReady(t, wns, "vs3")
	waitQuotaUsage(t, wns, 10<<20)
	t.Logf("kubectl get srq -n %s:\n%s", wns, kubectl(t, "get", "srq", "-n", wns))
}

// waitQuotaUsage waits until the namespace's quota shows bytes used.
func waitQuotaUsage(t *testing.T, namespace string, bytes int64) {
	t.Helper()
	var shown string
	ok := assert.Eventually(t, func() bool {
		out, err := kubectlOut(context.Background(), "-n", namespace, "get", "srq", v1beta1.DefaultResourceQuotaName,
			"-o", "jsonpath={.status.snapshotLimitStatus.namespaceTotalSnapshotSizeUsage}")
		if err != nil {
			return false
		}
		shown = out
		if out == "" {
			return bytes == 0
		}
		q, err := resource.ParseQuantity(out)
		return err == nil && q.Value() == bytes
	}, time.Minute, 250*time.Millisecond)
	require.True(t, ok, "the quota of %s shows %d bytes used (it shows %q)", namespace, bytes, shown)
}

package deployed

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// The space-management seed's namespace quota on the install (its test
// plan 5), met as a user meets it: a 10Mi quota, a 10Mi block claim
// written full by a Pod. The first VolumeSnapshot fits and the quota shows
// 10Mi used, the engines' own figure; with the claim written again the
// second is refused by the webhook (403) with the figures, and so is a
// Strata Snapshot an admin asks for directly; once the first is deleted a
// snapshot fits again. (test/e2e's TestQuotaNamespaceWithVolumeSnapshots,
// the same plan with CR-level writes, moved here.)
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
			chain, err := engineChain(volume)
			return err == nil && chain[types.VolumeHeadName] != nil && chain[types.VolumeHeadName].Size >= 10<<20
		}, time.Minute, 200*time.Millisecond, "the engine reports the head of %s full", volume)
	}

	fill()
	require.NoError(t, takeVolumeSnapshot(t, wns, "vs1", "data"))
	waitVolumeSnapshotReady(t, wns, "vs1")
	waitQuotaUsage(t, wns, 10<<20, volume)

	fill()
	err := takeVolumeSnapshot(t, wns, "vs2", "data")
	require.Error(t, err, "a second 10Mi snapshot is over the 10Mi quota")
	for _, part := range []string{"(Forbidden)", "snapshot space quota exceeded", "namespace " + wns, "hold 10Mi",
		"VolumeSnapshot " + wns + "/vs2 would add 10Mi", "quota of 10Mi"} {
		require.Contains(t, err.Error(), part)
	}
	// A Strata Snapshot asked for directly is charged the same way.
	const direct = "quota-d-direct" // in Strata's namespace: a name no other flow uses
	_, err = env.strata.StrataV1beta1().Snapshots(ns).Create(context.Background(), &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: direct, Namespace: ns},
		Spec:       v1beta1.SnapshotSpec{Volume: volume, CreateSnapshot: true}}, metav1.CreateOptions{})
	if err == nil {
		t.Cleanup(func() {
			_ = env.strata.StrataV1beta1().Snapshots(ns).Delete(context.Background(), direct, metav1.DeleteOptions{})
		})
	}
	require.Error(t, err, "a Strata Snapshot of the claim's volume is over the quota too")
	require.True(t, apierrors.IsForbidden(err), "403 Forbidden: %v", err)
	for _, part := range []string{"snapshot space quota exceeded", "namespace " + wns, "Snapshot " + direct + " would add 10Mi"} {
		require.Contains(t, err.Error(), part)
	}

	kubectl(t, "-n", wns, "delete", "volumesnapshot", "vs1", "--timeout=2m")
	waitQuotaUsage(t, wns, 0, volume)
	require.NoError(t, takeVolumeSnapshot(t, wns, "vs3", "data"))
	waitVolumeSnapshotReady(t, wns, "vs3")
	waitQuotaUsage(t, wns, 10<<20, volume)
	t.Logf("kubectl get srq -n %s:\n%s", wns, kubectl(t, "get", "srq", "-n", wns))
}

// waitQuotaUsage waits until the namespace's quota shows bytes used and
// the engines of the namespace's volumes hold that much in snapshots.
// Waiting for the two to agree is not enough: right after a delete both
// may still count a snapshot whose purge has not run.
func waitQuotaUsage(t *testing.T, namespace string, bytes int64, volumes ...string) {
	t.Helper()
	var shown string
	var engines int64
	ok := assert.Eventually(t, func() bool {
		out, err := kubectlOut(context.Background(), "-n", namespace, "get", "srq", v1beta1.DefaultResourceQuotaName,
			"-o", "jsonpath={.status.snapshotLimitStatus.namespaceTotalSnapshotSizeUsage}")
		if err != nil {
			return false
		}
		shown = out
		if engines, err = engineSnapshotBytes(volumes...); err != nil || engines != bytes {
			return false
		}
		if out == "" {
			return bytes == 0
		}
		q, err := resource.ParseQuantity(out)
		return err == nil && q.Value() == bytes
	}, time.Minute, 250*time.Millisecond)
	require.True(t, ok, "the quota of %s shows %d bytes used (it shows %q; the engines hold %d)", namespace, bytes, shown, engines)
}

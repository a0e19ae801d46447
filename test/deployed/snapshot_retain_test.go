package deployed

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/types"
)

// A VolumeSnapshotClass with deletionPolicy Retain: deleting the
// VolumeSnapshot keeps its VolumeSnapshotContent and the Strata snapshot
// behind it; once an admin switches the content to Delete and deletes it,
// the Strata snapshot goes. (Moved from test/e2e: a user's flow runs on
// the install.)
func testVolumeSnapshotRetainPolicy(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	apply(t, `apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: strata-retain}
driver: driver.strata.io
deletionPolicy: Retain`)
	t.Cleanup(func() { _, _ = kubectlOut(ctx, "delete", "volumesnapshotclass", "strata-retain", "--ignore-not-found") })
	claim(t, "retain-src", "")
	volume := volumeOfClaim(t, "retain-src")

	content := ""
	t.Cleanup(func() { // whatever the test left: the snapshot, then its content as an admin would
		_, _ = kubectlOut(ctx, "-n", podNamespace, "delete", "volumesnapshot", "retain-snap", "--ignore-not-found", "--timeout=60s")
		if content != "" {
			_, _ = kubectlOut(ctx, "patch", "volumesnapshotcontent", content, "--type", "merge", "-p", `{"spec":{"deletionPolicy":"Delete"}}`)
			_, _ = kubectlOut(ctx, "delete", "volumesnapshotcontent", content, "--ignore-not-found", "--timeout=60s")
		}
	})
	apply(t, `apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: retain-snap, namespace: `+podNamespace+`}
spec: {volumeSnapshotClassName: strata-retain, source: {persistentVolumeClaimName: retain-src}}`)
	waitVolumeSnapshotReady(t, podNamespace, "retain-snap")
	content = kubectl(t, "-n", podNamespace, "get", "volumesnapshot", "retain-snap", "-o", "jsonpath={.status.boundVolumeSnapshotContentName}")
	require.NotEmpty(t, content)
	assert.Equal(t, "Retain", kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.spec.deletionPolicy}"))
	handle := kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.status.snapshotHandle}")
	require.NotEmpty(t, handle)
	snap, err := env.strata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
	require.NoError(t, err, "the Strata snapshot behind the VolumeSnapshot")
	assert.Equal(t, volume, snap.Spec.Volume)
	assert.True(t, snap.Status.ReadyToUse)

	kubectl(t, "-n", podNamespace, "delete", "volumesnapshot", "retain-snap", "--wait=true", "--timeout=60s")
	// Retain: the content and the Strata snapshot stay. The deletion above
	// returned once the VolumeSnapshot was gone, and snapshot-controller
	// deletes a Delete-policy content before it lets the VolumeSnapshot go;
	// csi-snapshotter calls DeleteSnapshot only for a content being
	// deleted. So a content not being deleted now is retained for good,
	// and so is the Strata snapshot behind it.
	assert.Empty(t, kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.metadata.deletionTimestamp}"),
		"the content %s outlives the VolumeSnapshot, not being deleted (Retain)", content)
	s, err := env.strata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
	require.NoError(t, err, "the Strata snapshot outlives the VolumeSnapshot")
	assert.Nil(t, s.DeletionTimestamp, "the Strata snapshot %s is not being deleted (Retain)", handle)
	assert.Equal(t, "true", kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.status.readyToUse}"))

	// The admin releases it.
	kubectl(t, "patch", "volumesnapshotcontent", content, "--type", "merge", "-p", `{"spec":{"deletionPolicy":"Delete"}}`)
	kubectl(t, "delete", "volumesnapshotcontent", content, "--wait=true", "--timeout=60s")
	require.Eventually(t, func() bool {
		_, err := env.strata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}, time.Minute, 200*time.Millisecond, "the Strata snapshot goes with the content once its policy is Delete")
	left, err := env.strata.StrataV1beta1().Snapshots(ns).List(ctx, metav1.ListOptions{
		LabelSelector: types.LabelVolume + "=" + volume})
	require.NoError(t, err)
	assert.Empty(t, left.Items, "no Strata snapshot of the volume is left")
}

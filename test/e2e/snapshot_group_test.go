package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// seqWriterScript writes 1, 2, 3, ... over the same 12 bytes of /a/seq,
// fsynced, then the same number over /b/seq, fsynced: B is never ahead of
// A, and A at most one ahead. In place, never truncated: a crash leaves
// either number, never an empty file.
const seqWriterScript = `printf '%012d' 0 > /a/seq; printf '%012d' 0 > /b/seq; sync; i=0
while true; do i=$((i+1))
  printf '%012d' $i | dd of=/a/seq bs=12 count=1 conv=notrunc,fsync 2>/dev/null
  printf '%012d' $i | dd of=/b/seq bs=12 count=1 conv=notrunc,fsync 2>/dev/null
done`

// podWithClaims mounts claims at /a, /b, ... in that order.
func podWithClaims(name, node, script string, claims ...string) *corev1.Pod {
	pod := workloadPod(name, node, script)
	for i, claim := range claims {
		dir := string(rune('a' + i))
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: dir, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: dir, MountPath: "/" + dir})
	}
	return pod
}

// createSnapshotGroup applies a SnapshotGroup of volumes and waits until it
// is Ready.
func createSnapshotGroup(t *testing.T, name string, volumes ...string) *v1beta1.SnapshotGroup {
	t.Helper()
	kubectlApply(t, fmt.Sprintf(`apiVersion: strata.io/v1beta1
kind: SnapshotGroup
metadata: {name: %s, namespace: %s}
spec: {volumes: [%s]}`, name, types.DefaultNamespace, strings.Join(volumes, ", ")))
	t.Cleanup(func() {
		_, _ = tryKubectl(t, "-n", types.DefaultNamespace, "delete", "snapshotgroup", name, "--ignore-not-found")
	})
	var g *v1beta1.SnapshotGroup
	require.Eventually(t, func() bool {
		var err error
		g, err = env.adminStrata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && g.Status.State == v1beta1.SnapshotGroupReady
	}, 2*time.Minute, 200*time.Millisecond, "group %s Ready; last %+v", name, g)
	return g
}

// restoreMember binds a member snapshot to a pre-provisioned
// VolumeSnapshot, as an admin imports an existing snapshot, and makes a
// claim of it.
func restoreMember(t *testing.T, snapshot, claim string) {
	t.Helper()
	kubectlApply(t, fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: %[1]s-content}
spec:
  deletionPolicy: Retain
  driver: %[3]s
  source: {snapshotHandle: %[1]s}
  volumeSnapshotRef: {name: %[1]s, namespace: %[2]s}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %[1]s, namespace: %[2]s}
spec: {source: {volumeSnapshotContentName: %[1]s-content}}`, snapshot, podNamespace, types.CSIDriverName))
	t.Cleanup(func() {
		_, _ = tryKubectl(t, "-n", podNamespace, "delete", "volumesnapshot", snapshot, "--ignore-not-found")
		_, _ = tryKubectl(t, "delete", "volumesnapshotcontent", snapshot+"-content", "--ignore-not-found")
	})
	waitVolumeSnapshotReady(t, snapshot, 2*time.Minute)
	boundVolume(t, createPVCFrom(t, claim, "64Mi", "snapshot.storage.k8s.io", "VolumeSnapshot", snapshot))
}

// A Pod writes a sequence to two claims, B never ahead of A. Group
// snapshots of the two volumes, restored to new claims, hold that in every
// cut; the members carry the group's label, and deleting the group
// deletes them.
func TestSnapshotGroupIsCrashConsistentThroughPods(t *testing.T) {
	t.Parallel() // claims and Pods of its own, no fault
	const cuts = 2
	a, b := createPVC(t, "sg-a", "64Mi"), createPVC(t, "sg-b", "64Mi")
	volA, volB := boundVolume(t, a), boundVolume(t, b)
	createPod(t, podWithClaims("sg-writer", "127.0.0.2", seqWriterScript, a.Name, b.Name))
	waitPodRunning(t, "sg-writer")
	readSeq := func(pod, dir string) int {
		out := kubectl(t, "-n", podNamespace, "exec", pod, "--", "cat", "/"+dir+"/seq")
		n, err := strconv.Atoi(strings.TrimSpace(out))
		require.NoError(t, err, "seq %q", out)
		return n
	}
	require.Eventually(t, func() bool { return readSeq("sg-writer", "b") > 20 }, time.Minute, 200*time.Millisecond, "the writer runs")

	for i := range cuts {
		name := fmt.Sprintf("sg-cut%d", i)
		g := createSnapshotGroup(t, name, volA, volB)
		require.Len(t, g.Status.Snapshots, 2)
		t.Logf("group %s: writes held %d ms", name, g.Status.StallMilliseconds)
		out := kubectl(t, "-n", types.DefaultNamespace, "get", "snap", "-l", types.LabelSnapshotGroup+"="+name, "-o", "name")
		assert.Len(t, strings.Fields(out), 2, "kubectl get snap -l %s=%s lists both members", types.LabelSnapshotGroup, name)

		var claims []string
		for j, m := range g.Status.Snapshots {
			claim := fmt.Sprintf("%s-r%d", name, j)
			restoreMember(t, m.Snapshot, claim)
			claims = append(claims, claim)
		}
		// The members are in spec order: A's first.
		require.Equal(t, volA, g.Status.Snapshots[0].Volume)
		reader := name + "-reader"
		createPod(t, podWithClaims(reader, "127.0.0.3", "sleep 3600", claims...))
		waitPodRunning(t, reader)
		na, nb := readSeq(reader, "a"), readSeq(reader, "b")
		t.Logf("cut %s restored: A at %d, B at %d", name, na, nb)
		assert.Contains(t, []int{nb, nb + 1}, na, "cut %s: B never ahead of A, A at most one ahead", name)
		assert.Positive(t, nb, "the cut holds writes")
	}

	kubectl(t, "-n", types.DefaultNamespace, "delete", "snapshotgroup", "sg-cut0", "--wait=true", "--timeout=60s")
	require.Eventually(t, func() bool {
		out, err := tryKubectl(t, "-n", types.DefaultNamespace, "get", "snap", "-l", types.LabelSnapshotGroup+"=sg-cut0", "-o", "name")
		return err == nil && strings.TrimSpace(out) == ""
	}, 2*time.Minute, 500*time.Millisecond, "the group's members go with it")
}

// The CSI GroupController against the real managers: two detached volumes
// made through CreateVolume are attached for the cut (the group's tickets),
// cut, and detached again; the answer lists both members, ready, and Get
// says the same; Delete takes the group and its members away, and is
// idempotent.
func TestCSIGroupControllerSnapshotsDetachedVolumes(t *testing.T) {
	t.Parallel() // volumes of its own, no fault
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn := startCSIController(t)
	controller, groups := csispec.NewControllerClient(conn), csispec.NewGroupControllerClient(conn)
	rwo := []*csispec.VolumeCapability{{AccessType: &csispec.VolumeCapability_Mount{Mount: &csispec.VolumeCapability_MountVolume{}},
		AccessMode: &csispec.VolumeCapability_AccessMode{Mode: csispec.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	var ids []string
	for _, name := range []string{"pvc-e2e-vgs-a", "pvc-e2e-vgs-b"} {
		v, err := controller.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: name, VolumeCapabilities: rwo,
			CapacityRange: &csispec.CapacityRange{RequiredBytes: 16 << 20}, Parameters: map[string]string{"numberOfReplicas": "2"}})
		require.NoError(t, err)
		ids = append(ids, v.Volume.VolumeId)
		t.Cleanup(func() {
			_, _ = controller.DeleteVolume(context.Background(), &csispec.DeleteVolumeRequest{VolumeId: v.Volume.VolumeId})
			waitVolumeGone(t, v.Volume.VolumeId)
		})
	}
	resp, err := groups.CreateVolumeGroupSnapshot(ctx, &csispec.CreateVolumeGroupSnapshotRequest{Name: "vgs-e2e", SourceVolumeIds: ids})
	require.NoError(t, err)
	g := resp.GroupSnapshot
	assert.Equal(t, "vgs-e2e", g.GroupSnapshotId)
	assert.True(t, g.ReadyToUse)
	require.Len(t, g.Snapshots, 2)
	var members []string
	for _, s := range g.Snapshots {
		assert.True(t, s.ReadyToUse)
		assert.Equal(t, "vgs-e2e", s.GroupSnapshotId)
		assert.Contains(t, ids, s.SourceVolumeId)
		members = append(members, s.SnapshotId)
	}
	got, err := groups.GetVolumeGroupSnapshot(ctx, &csispec.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "vgs-e2e"})
	require.NoError(t, err)
	assert.True(t, got.GroupSnapshot.ReadyToUse)
	for _, id := range ids {
		require.Eventually(t, func() bool { return getVolume(t, id).Status.State == v1beta1.VolumeStateDetached },
			time.Minute, 200*time.Millisecond, "volume %s detached again after the cut", id)
	}

	_, err = groups.DeleteVolumeGroupSnapshot(ctx, &csispec.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "vgs-e2e", SnapshotIds: members})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, m := range members {
			if _, err := env.adminStrata.StrataV1beta1().Snapshots(types.DefaultNamespace).Get(ctx, m, metav1.GetOptions{}); err == nil {
				return false
			}
		}
		return true
	}, 2*time.Minute, 500*time.Millisecond, "the members go with the group")
	_, err = groups.DeleteVolumeGroupSnapshot(ctx, &csispec.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "vgs-e2e"})
	require.NoError(t, err, "a second delete succeeds")
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

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

// kill -9 of the manager taking a group's cut, while its status says
// Cutting (recorded just before the cut): the restarted manager rolls the
// cut back and cuts again. Nothing of the killed cut remains in either
// engine's chain, the members listed are exactly the group's labelled
// Snapshots, and the Pod's writes go on. A kill can land after the cut's
// end was written too; the test tries until one lands inside.
func TestSnapshotGroupSurvivesItsManagerKilledMidCut(t *testing.T) {
	const tries = 10
	a, b := createPVC(t, "sgk-a", "64Mi"), createPVC(t, "sgk-b", "64Mi")
	volA, volB := boundVolume(t, a), boundVolume(t, b)
	createPod(t, podWithClaims("sgk-writer", "127.0.0.2", seqWriterScript, a.Name, b.Name))
	waitPodRunning(t, "sgk-writer")
	require.Eventually(t, func() bool { return readSeqs(t, "sgk-writer", 2)[1] > 20 }, time.Minute, 200*time.Millisecond, "the writer runs")

	ctx := context.Background()
	groups := env.adminStrata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace)
	landed := 0
	for i := 0; i < tries && landed == 0; i++ {
		name := fmt.Sprintf("sgk-%d", i)
		w, err := groups.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		require.NoError(t, err)
		_, err = groups.Create(ctx, &v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
			Spec: v1beta1.SnapshotGroupSpec{Volumes: []string{volA, volB}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = groups.Delete(context.Background(), name, metav1.DeleteOptions{}) })
		owner := cuttingOwner(w)
		w.Stop()
		require.NotEmpty(t, owner, "group %s never reported Cutting", name)
		killAndRestartManager(t, owner)
		g := waitGroupEnded(t, name)
		require.Equal(t, v1beta1.SnapshotGroupReady, g.Status.State, "group %s: %s", name, g.Status.Error)
		if g.Status.Attempt > 1 {
			landed++
			t.Logf("group %s: manager %s killed in cut 1; cut %d ready, writes held %d ms", name, owner, g.Status.Attempt, g.Status.StallMilliseconds)
		}
		requireNothingHalfTaken(t, g, volA, volB)
	}
	require.Positive(t, landed, "a kill landed inside a cut in %d tries", tries)

	before := readSeqs(t, "sgk-writer", 2)[1]
	require.Eventually(t, func() bool { return readSeqs(t, "sgk-writer", 2)[1] > before+10 }, time.Minute, 200*time.Millisecond,
		"the Pod's writes go on after the kill")
}

// cuttingOwner waits on a SnapshotGroup watch for Cutting and returns the
// node cutting it; "" if the group ended first.
func cuttingOwner(w watch.Interface) string {
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return ""
			}
			g, isGroup := ev.Object.(*v1beta1.SnapshotGroup)
			switch {
			case !isGroup:
			case g.Status.State == v1beta1.SnapshotGroupCutting:
				return g.Status.OwnerID
			case g.Status.State == v1beta1.SnapshotGroupReady || g.Status.State == v1beta1.SnapshotGroupFailed:
				return ""
			}
		case <-timeout:
			return ""
		}
	}
}

func waitGroupEnded(t *testing.T, name string) *v1beta1.SnapshotGroup {
	t.Helper()
	var g *v1beta1.SnapshotGroup
	require.Eventually(t, func() bool {
		var err error
		g, err = env.adminStrata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && (g.Status.State == v1beta1.SnapshotGroupReady || g.Status.State == v1beta1.SnapshotGroupFailed)
	}, 3*time.Minute, 200*time.Millisecond, "group %s ends; last %+v", name, g)
	return g
}

// requireNothingHalfTaken: the group's labelled Snapshots are its listed
// members, and no engine chain keeps a snapshot of the group's name that
// is not one of them (a killed cut's), unless removed and awaiting purge.
func requireNothingHalfTaken(t *testing.T, g *v1beta1.SnapshotGroup, volumes ...string) {
	t.Helper()
	var members []string
	for _, m := range g.Status.Snapshots {
		members = append(members, m.Snapshot)
	}
	slices.Sort(members)
	require.Len(t, members, len(volumes))
	require.Eventually(t, func() bool {
		list, err := env.adminStrata.StrataV1beta1().Snapshots(types.DefaultNamespace).List(context.Background(),
			metav1.ListOptions{LabelSelector: types.LabelSnapshotGroup + "=" + g.Name})
		if err != nil {
			return false
		}
		var labelled []string
		for _, s := range list.Items {
			labelled = append(labelled, s.Name)
		}
		slices.Sort(labelled)
		return slices.Equal(labelled, members)
	}, time.Minute, 200*time.Millisecond, "group %s: its labelled Snapshots are exactly %v", g.Name, members)
	var strays []string
	require.Eventually(t, func() bool {
		strays = nil
		for _, vol := range volumes {
			for name, s := range engineChain(t, vol) {
				if strings.HasPrefix(name, g.Name+"-") && !s.Removed && !slices.Contains(members, name) {
					strays = append(strays, vol+"/"+name)
				}
			}
		}
		return len(strays) == 0
	}, time.Minute, 200*time.Millisecond, "group %s: the engines keep snapshots of it that are not members: %v", g.Name, strays)
}

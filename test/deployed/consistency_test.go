package deployed

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/internal/fsfreeze"
)

// Issue 43: what a user of a claim expects of it. A non-root Pod with an
// fsGroup writes its claim; a snapshot taken right after a plain write
// (no fsync) holds it, because the node plugin freezes the filesystem
// while the snapshot is cut; a freeze never outlives its snapshot.

// xfsClass is a StorageClass of xfs claims, made once per test that asks.
func xfsClass(t *testing.T, prefix string) string {
	t.Helper()
	name := "strata-xfs-" + prefix // a class of its own: tests run side by side
	apply(t, fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %s}
provisioner: driver.strata.io
parameters: {numberOfReplicas: "2", csi.storage.k8s.io/fstype: xfs}
allowVolumeExpansion: true`, name))
	t.Cleanup(func() {
		_, _ = kubectlOut(context.Background(), "delete", "storageclass", name, "--ignore-not-found")
	})
	return name
}

// podAs runs script as uid/gid uid with that fsGroup and the given
// fsGroupChangePolicy (root when uid is 0, no fsGroup), the claim at /data.
func podAs(t *testing.T, name, node, claimName string, uid int, policy, script string) {
	t.Helper()
	security := "{}"
	if uid != 0 {
		security = fmt.Sprintf("{runAsUser: %d, runAsGroup: %d, fsGroup: %d, fsGroupChangePolicy: %s}", uid, uid, uid, policy)
	}
	podWithSecurity(t, podNamespace, name, node, claimName, script, false, security)
}

func deletePod(t *testing.T, name string) {
	t.Helper()
	kubectl(t, "-n", podNamespace, "delete", "pod", name, "--grace-period=1", "--wait=true")
}

// pvFsType is the filesystem type recorded in the claim's PV.
func pvFsType(t *testing.T, claimName string) string {
	t.Helper()
	return kubectl(t, "get", "pv", volumeOfClaim(t, claimName), "-o", "jsonpath={.spec.csi.fsType}")
}

// A Pod running as uid 1000 with fsGroup 1000 writes its claim: ext4 and
// xfs claims, and one restored from a VolumeSnapshot. With OnRootMismatch
// the kubelet skips the walk once the root is right: a root-owned file
// made in between keeps its group on the next mount.
func testNonRootPodWritesItsClaim(t *testing.T) {
	logsOnFailure(t)
	xfs := xfsClass(t, "nr")
	claim(t, "nr-ext4", "")
	claimIn(t, podNamespace, "nr-xfs", "300Mi", "storageClassName: "+xfs)
	for _, tc := range []struct{ claim, fsType string }{{"nr-ext4", "ext4"}, {"nr-xfs", "xfs"}} {
		t.Run(tc.fsType, func(t *testing.T) {
			assert.Equal(t, tc.fsType, pvFsType(t, tc.claim), "the PV names its filesystem, so the kubelet applies fsGroup")
			podAs(t, tc.claim, "127.0.0.1", tc.claim, 1000, "OnRootMismatch", "echo hi > /data/x && exec sleep 3600")
			assert.Equal(t, "hi", exec1(t, tc.claim, "cat /data/x"))
			assert.Equal(t, "1000 1000", exec1(t, tc.claim, "stat -c '%u %g' /data/x"))
			assert.Equal(t, "1000", exec1(t, tc.claim, "stat -c %g /data"), "the root of the claim is the fsGroup's")
			deletePod(t, tc.claim)

			// A root Pod leaves a file of group 0 (chgrp: the setgid root would
			// give it the fsGroup); the next fsGroup Pod with
			// OnRootMismatch finds the root right and does not walk.
			podAs(t, tc.claim+"-root", "127.0.0.1", tc.claim, 0, "", "echo r > /data/rootfile && chgrp 0 /data/rootfile && chmod 600 /data/rootfile && exec sleep 3600")
			deletePod(t, tc.claim+"-root")
			podAs(t, tc.claim+"-2", "127.0.0.1", tc.claim, 1000, "OnRootMismatch", "echo again >> /data/x && exec sleep 3600")
			assert.Equal(t, "hi\nagain", exec1(t, tc.claim+"-2", "cat /data/x"))
			assert.Equal(t, "0", exec1(t, tc.claim+"-2", "stat -c %g /data/rootfile"), "OnRootMismatch skipped the walk")
		})
	}
	t.Run("restored", func(t *testing.T) {
		require.NoError(t, takeVolumeSnapshot(t, podNamespace, "nr-snap", "nr-ext4"))
		waitVolumeSnapshotReady(t, podNamespace, "nr-snap")
		claim(t, "nr-restored", "nr-snap")
		assert.Equal(t, "ext4", pvFsType(t, "nr-restored"))
		podAs(t, "nr-restored", "127.0.0.2", "nr-restored", 1000, "Always", "echo more >> /data/x && exec sleep 3600")
		assert.Equal(t, "hi\nagain\nmore", exec1(t, "nr-restored", "cat /data/x"))
		assert.Equal(t, "1000", exec1(t, "nr-restored", "stat -c %g /data/rootfile"), "Always walks the tree")
	})
}

// A Pod writes a file with a plain echo (no fsync) and a VolumeSnapshot is
// asked for at once; the claim restored from it has the file, on ext4 and
// xfs. Every trial's snapshot says it was cut inside a filesystem freeze.
// make test runs 3 trials of each; TestLongSnapshotHoldsWhatThePodJustWrote
// the 20.
func testSnapshotHoldsWhatThePodJustWrote(t *testing.T) { snapshotsHoldWhatThePodJustWrote(t, "jw", 3) }

func TestLongSnapshotHoldsWhatThePodJustWrote(t *testing.T) {
	snapshotsHoldWhatThePodJustWrote(t, "jwl", 20)
}

func snapshotsHoldWhatThePodJustWrote(t *testing.T, prefix string, trials int) {
	logsOnFailure(t)
	xfs := xfsClass(t, prefix)
	for _, tc := range []struct{ fsType, class, size string }{{"ext4", "", "64Mi"}, {"xfs", xfs, "300Mi"}} {
		t.Run(tc.fsType, func(t *testing.T) {
			src := prefix + "-" + tc.fsType
			extra := ""
			if tc.class != "" {
				extra = "storageClassName: " + tc.class
			}
			claimIn(t, podNamespace, src, tc.size, extra)
			pod(t, src, "127.0.0.1", src, "exec sleep 3600")
			var gaps []time.Duration
			for i := range trials {
				snap := fmt.Sprintf("%s-%d", src, i)
				exec1(t, src, fmt.Sprintf("echo trial-%d > /data/f%d", i, i))
				wrote := time.Now()
				createVolumeSnapshot(t, snap, src)
				gaps = append(gaps, time.Since(wrote))
				// Far inside the kernel's 30 s before writeback takes dirty
				// data on its own (vm.dirty_expire_centisecs): the file is
				// on the disk by the freeze, not by time. (Under make test's
				// side-by-side flows the create took up to 135 ms.)
				assert.Less(t, gaps[i], time.Second, "the VolumeSnapshot asked for within a second of the write")
			}
			t.Logf("%s: write → VolumeSnapshot created: %v", tc.fsType, gaps)
			// Restored in batches, each claim gone once read: 20 trials of
			// 300Mi xfs claims at once would crowd the nodes' disks.
			const batch = 5
			for first := 0; first < trials; first += batch {
				last := min(first+batch, trials)
				for i := first; i < last; i++ {
					snap := fmt.Sprintf("%s-%d", src, i)
					waitVolumeSnapshotReady(t, podNamespace, snap)
					claimIn(t, podNamespace, snap, tc.size, extra+sep(extra)+
						fmt.Sprintf("dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: %s}", snap))
				}
				for i := first; i < last; i++ {
					snap := fmt.Sprintf("%s-%d", src, i)
					pod(t, snap, env.nodes[1+i%2], snap, "exec sleep 3600")
					assert.Equal(t, fmt.Sprintf("trial-%d", i), exec1(t, snap, fmt.Sprintf("cat /data/f%d", i)),
						"trial %d: the restored claim holds the file written just before the snapshot", i)
					deletePod(t, snap)
					kubectl(t, "-n", podNamespace, "delete", "pvc", snap, "--wait=false")
				}
			}
			consistency := snapshotConsistencies(t, volumeOfClaim(t, src))
			assert.Len(t, consistency, trials)
			for name, c := range consistency {
				assert.Equal(t, string(fsfreeze.Filesystem), c, "snapshot %s", name)
			}
		})
	}
}

func sep(s string) string {
	if s == "" {
		return ""
	}
	return ", "
}

// snapshotConsistencies maps each Strata snapshot of volume to its
// status.consistency.
func snapshotConsistencies(t *testing.T, volume string) map[string]string {
	t.Helper()
	out := map[string]string{}
	list, err := env.strata.StrataV1beta1().Snapshots(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: "strata.io/volume=" + volume})
	require.NoError(t, err)
	for _, s := range list.Items {
		out[s.Name] = s.Status.Consistency
	}
	return out
}

// freezeSocket is the node plugin's freeze socket on a node, as the
// chart sets it.
func freezeSocket(t *testing.T, node string) string {
	t.Helper()
	return filepath.Join(clusterNode(t, node).StrataDir(), "run", "fsfreeze", "plugin.sock")
}

// stagedMount finds where the claim's filesystem is mounted on the host.
func stagedMount(t *testing.T, node, volume string) string {
	t.Helper()
	device := loopDeviceOf(t, node, volume)
	mount, err := fsfreeze.MountPointOf(device)
	require.NoError(t, err)
	require.NotEmpty(t, mount, "%s is mounted", device)
	return mount
}

// frozen asks the kernel: a second FIFREEZE of a frozen filesystem is EBUSY.
func frozen(t *testing.T, mountPoint string) bool {
	t.Helper()
	err := fsfreeze.SystemOps.Freeze(mountPoint)
	if err == nil {
		require.NoError(t, fsfreeze.SystemOps.Thaw(mountPoint))
		return false
	}
	require.ErrorIs(t, err, unix.EBUSY)
	return true
}

// The node plugin killed with -9 while it holds a claim's filesystem
// frozen: its container restarts and thaws it from its record, and the
// Pod's write that waited on the freeze completes.
func TestFreezeHolderKilledWhileFrozen(t *testing.T) {
	logsOnFailure(t)
	claim(t, "fz-kill", "")
	pod(t, "fz-kill", "127.0.0.1", "fz-kill", "exec sleep 3600")
	volume := volumeOfClaim(t, "fz-kill")
	mount := stagedMount(t, "127.0.0.1", volume)
	client := fsfreeze.NewClient(freezeSocket(t, "127.0.0.1"))
	got, err := client.Freeze(context.Background(), volume, "test-cut", fsfreeze.MaxTimeout)
	require.NoError(t, err)
	require.Equal(t, fsfreeze.Filesystem, got)
	require.True(t, frozen(t, mount))
	// A write now waits for the thaw.
	wrote := make(chan string, 1)
	go func() { wrote <- strings.TrimSpace(execOut("fz-kill", "echo after > /data/after && cat /data/after")) }()

	plugin := podOf(t, "strata-csi-node", "127.0.0.1")
	restarts := containerRestarts(t, plugin)
	out, err := exec.Command("pkill", "-9", "-f", "strata-manager csi --mode=node --node-name=127.0.0.1").CombinedOutput()
	require.NoError(t, err, "pkill: %s", out)
	killed := time.Now()
	require.Eventually(t, func() bool { return containerRestarts(t, plugin) > restarts },
		2*time.Minute, 200*time.Millisecond, "the plugin's container restarts")
	restarted := time.Now()
	require.Eventually(t, func() bool { return !frozen(t, mount) }, time.Minute, 100*time.Millisecond, "thawed after the restart")
	t.Logf("killed → container restarted %v, restarted → thawed %v",
		restarted.Sub(killed).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	assert.Less(t, time.Since(restarted), 10*time.Second, "thawed within 10 s of the restart")
	select {
	case out := <-wrote:
		assert.Equal(t, "after", out, "the Pod's write went through")
	case <-time.After(time.Minute):
		t.Fatal("the Pod's write never completed")
	}
}

func containerRestarts(t *testing.T, pod string) int {
	t.Helper()
	p, err := env.kube.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	require.NoError(t, err)
	n := 0
	for _, c := range p.Status.ContainerStatuses {
		n += int(c.RestartCount)
	}
	return n
}

// A VolumeGroupSnapshot of two claims a Pod has just written (plain echo,
// no fsync): every member's filesystem is frozen before the group is cut,
// so each member restored holds its file.
func testGroupSnapshotHoldsWhatThePodJustWrote(t *testing.T) {
	logsOnFailure(t)
	ctx := context.Background()
	for _, name := range []string{"gw-a", "gw-b"} {
		apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s, labels: {consistency-group: gw}}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}`, name, podNamespace))
		t.Cleanup(func() { _, _ = kubectlOut(ctx, "-n", podNamespace, "delete", "pvc", name, "--wait=false") })
		pod(t, name, "127.0.0.1", name, "exec sleep 3600")
	}
	exec1(t, "gw-a", "echo in-a > /data/a")
	exec1(t, "gw-b", "echo in-b > /data/b")
	apply(t, fmt.Sprintf(`apiVersion: groupsnapshot.storage.k8s.io/v1
kind: VolumeGroupSnapshot
metadata: {name: gw, namespace: %s}
spec: {source: {selector: {matchLabels: {consistency-group: gw}}}}`, podNamespace))
	t.Cleanup(func() {
		_, _ = kubectlOut(ctx, "-n", podNamespace, "delete", "volumegroupsnapshot", "gw", "--wait=false")
	})

	members := map[string]string{} // claim -> member VolumeSnapshot
	require.Eventually(t, func() bool {
		out, err := kubectlOut(ctx, "-n", podNamespace, "get", "volumesnapshot", "-o",
			`jsonpath={range .items[?(@.metadata.ownerReferences[0].kind=="VolumeGroupSnapshot")]}{.spec.source.persistentVolumeClaimName} {.metadata.name} {.status.readyToUse}{"\n"}{end}`)
		if err != nil {
			return false
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[2] == "true" {
				members[f[0]] = f[1]
			}
		}
		return members["gw-a"] != "" && members["gw-b"] != ""
	}, 2*time.Minute, 250*time.Millisecond, "the group's member VolumeSnapshots ready")
	for claimName, file := range map[string]string{"gw-a": "a", "gw-b": "b"} {
		restored := claimName + "-r"
		claim(t, restored, members[claimName])
		pod(t, restored, "127.0.0.2", restored, "exec sleep 3600")
		assert.Equal(t, "in-"+file, exec1(t, restored, "cat /data/"+file), "member of %s holds the file written just before the group", claimName)
	}
	for _, claimName := range []string{"gw-a", "gw-b"} {
		for name, c := range snapshotConsistencies(t, volumeOfClaim(t, claimName)) {
			assert.Equal(t, string(fsfreeze.Filesystem), c, "group member %s", name)
		}
	}
}

// A block-mode claim has no filesystem to freeze: what a Pod wrote through
// the device's page cache (no fsync, no O_DIRECT) is flushed before the
// cut, and the snapshot says "flushed".
func testBlockSnapshotHoldsWhatThePodJustWrote(t *testing.T) {
	logsOnFailure(t)
	claimIn(t, podNamespace, "bw", "16Mi", "volumeMode: Block")
	podIn(t, podNamespace, "bw", "127.0.0.1", "bw", "exec sleep 3600", true)
	exec1(t, "bw", "echo block-data | dd of="+blockDevice+" bs=512 seek=8 conv=notrunc 2>/dev/null")
	require.NoError(t, takeVolumeSnapshot(t, podNamespace, "bw-snap", "bw"))
	waitVolumeSnapshotReady(t, podNamespace, "bw-snap")
	claimIn(t, podNamespace, "bw-r", "16Mi",
		"volumeMode: Block, dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: bw-snap}")
	podIn(t, podNamespace, "bw-r", "127.0.0.2", "bw-r", "exec sleep 3600", true)
	assert.Equal(t, "block-data", exec1(t, "bw-r", "dd if="+blockDevice+" bs=512 skip=8 count=1 2>/dev/null | head -c 10"))
	for name, c := range snapshotConsistencies(t, volumeOfClaim(t, "bw")) {
		assert.Equal(t, string(fsfreeze.Flushed), c, "snapshot %s", name)
	}
}

var gvrVolumeSnapshot = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

// createVolumeSnapshot creates a VolumeSnapshot of claimName with one API
// call (kubectl apply takes tens of milliseconds to start), deleted when
// the test ends.
func createVolumeSnapshot(t *testing.T, name, claimName string) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": podNamespace},
		"spec": map[string]any{"volumeSnapshotClassName": "strata",
			"source": map[string]any{"persistentVolumeClaimName": claimName}},
	}}
	_, err := env.dynamic.Resource(gvrVolumeSnapshot).Namespace(podNamespace).Create(context.Background(), obj, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = env.dynamic.Resource(gvrVolumeSnapshot).Namespace(podNamespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

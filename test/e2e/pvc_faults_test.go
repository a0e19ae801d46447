package e2e

import (
	"context"
	"hash/fnv"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Faults in the middle of the longest CSI operations: a process is killed
// with SIGKILL while the operation is under way, started again, and the
// operation converges to exactly what it would have made without the kill.

// The controller plugin killed while CreateVolume is under way (the volume
// exists, the claim is not bound): after the restart the claim binds to that
// one volume, not to a second one.
func TestCSIControllerKilledDuringCreateVolume(t *testing.T) {
	pvc := createPVC(t, "fault-create", "64Mi")
	vol := waitClaimVolumeCR(t, pvc.Name, func(*v1beta1.Volume) bool { return true })
	require.Empty(t, getVolumeOfClaimOrEmpty(pvc.Name), "the claim is not bound yet when the plugin is killed")
	killCSIController(t)
	t.Logf("csi-controller killed while volume %s was in state %q", vol.Name, vol.Status.State)
	time.Sleep(time.Second)
	restartCSIController(t)

	start := time.Now()
	volume := boundVolume(t, pvc)
	t.Logf("claim bound %s after the restart", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, vol.Name, volume, "bound to the volume the killed call made")
	assert.Equal(t, []string{volume}, volumesOfClaim(t, pvc.Name), "exactly one volume for the claim")
	waitVolume(t, volume, time.Minute, "detached", isDetached)
	assert.Equal(t, []string{volume}, volumesOfClaim(t, pvc.Name), "still exactly one volume for the claim")
}

// The controller plugin killed while a VolumeSnapshot's CreateSnapshot is
// under way (the Strata snapshot exists and is not ready): after the restart
// the VolumeSnapshot becomes readyToUse with that one snapshot.
func TestCSIControllerKilledDuringCreateSnapshot(t *testing.T) {
	ctx := context.Background()
	pvc := createPVC(t, "fault-snap-src", "64Mi")
	volume := boundVolume(t, pvc)
	// Detached, the snapshot has to attach the volume first: the longest way.
	waitVolume(t, volume, time.Minute, "detached", isDetached)

	kubectlApply(t, `apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: fault-snap, namespace: default}
spec: {volumeSnapshotClassName: strata, source: {persistentVolumeClaimName: fault-snap-src}}`)
	t.Cleanup(func() {
		_, _ = tryKubectl(t, "-n", podNamespace, "delete", "volumesnapshot", "fault-snap", "--ignore-not-found", "--timeout=60s")
	})
	var snap v1beta1.Snapshot
	require.Eventually(t, func() bool {
		snaps := snapshotsOf(t, volume)
		if len(snaps) == 0 {
			return false
		}
		snap = snaps[0]
		return true
	}, time.Minute, 10*time.Millisecond, "the driver makes the Strata snapshot")
	require.False(t, snap.Status.ReadyToUse, "the snapshot is still being taken when the plugin is killed")
	killCSIController(t)
	ready, _ := tryKubectl(t, "-n", podNamespace, "get", "volumesnapshot", "fault-snap", "-o", "jsonpath={.status.readyToUse}")
	require.NotEqual(t, "true", ready, "the VolumeSnapshot was not ready when the plugin was killed")
	t.Logf("csi-controller killed while Strata snapshot %s was not ready", snap.Name)
	time.Sleep(time.Second)
	restartCSIController(t)

	waitVolumeSnapshotReady(t, "fault-snap", 2*time.Minute)
	content := kubectl(t, "-n", podNamespace, "get", "volumesnapshot", "fault-snap", "-o", "jsonpath={.status.boundVolumeSnapshotContentName}")
	handle := kubectl(t, "get", "volumesnapshotcontent", content, "-o", "jsonpath={.status.snapshotHandle}")
	assert.Equal(t, snap.Name, handle, "the VolumeSnapshot is the snapshot the killed call made")
	snaps := snapshotsOf(t, volume)
	require.Len(t, snaps, 1, "exactly one Strata snapshot of the volume")
	assert.Equal(t, handle, snaps[0].Name)
	assert.True(t, snaps[0].Status.ReadyToUse)

	kubectl(t, "-n", podNamespace, "delete", "volumesnapshot", "fault-snap", "--wait=true", "--timeout=60s")
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Get(ctx, handle, metav1.GetOptions{})
		return err != nil
	}, time.Minute, 200*time.Millisecond, "the Strata snapshot goes with the VolumeSnapshot")
}

// The node plugin of the Pod's node killed while the Pod starts, at three
// points: as soon as the VolumeAttachment is attached (before the kubelet
// stages), as soon as the volume's loop device is bound to its instance
// manager's file (inside NodeStageVolume's connect), and as soon as the staging mount is up (before or during
// NodePublishVolume). Restarted, the plugin stages and publishes; the Pod
// runs and uses the volume; once the Pod and the claim are deleted, nothing
// of the volume is left on the node. make test kills at the middle point
// (inside the connect, the one with the most to undo); make test-long at
// all three.
func TestCSINodePluginKilledWhilePodStarts(t *testing.T) {
	nodePluginKilledWhilePodStarts(t, "loop device bound")
}

func TestLongCSINodePluginKilledWhilePodStarts(t *testing.T) {
	nodePluginKilledWhilePodStarts(t, "VolumeAttachment attached", "loop device bound", "staging mount up")
}

func nodePluginKilledWhilePodStarts(t *testing.T, points ...string) {
	node := nodeByName(t, "127.0.0.2")
	const plugin = "csi-node-node-2"
	cases := []struct {
		name, claim string
		// killNow says whether the Pod's start has reached the kill point.
		killNow func(t *testing.T, pv, volume string) bool
	}{
		{"VolumeAttachment attached", "fault-node-attached", func(t *testing.T, pv, _ string) bool {
			return storageAttached(t, pv, node.Name)
		}},
		{"loop device bound", "fault-node-connect", func(t *testing.T, _, volume string) bool {
			return len(loopsOnTheInstanceManagersFile(volume)) > 0
		}},
		{"staging mount up", "fault-node-staged", func(t *testing.T, _, _ string) bool {
			return len(localcluster.MountsUnder(filepath.Join(node.KubeletRoot(), "plugins/kubernetes.io/csi/driver.strata.io"))) > 0
		}},
	}
	for _, tc := range cases {
		if !slices.Contains(points, tc.name) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			loopsBefore := localcluster.LoopDevices()
			pvc := createPVC(t, tc.claim, "64Mi")
			volume := boundVolume(t, pvc)
			bound, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, pvc.Name, metav1.GetOptions{})
			require.NoError(t, err)
			pv := bound.Spec.VolumeName
			stateDir := filepath.Join(node.CSIStateDir(), volume)

			pod := podWithClaim(tc.claim, node.Name, pvc.Name, "echo written > /data/f; sync; sleep 3600")
			created := createPod(t, pod)
			var attached time.Duration
			require.Eventually(t, func() bool {
				if attached == 0 && storageAttached(t, pv, node.Name) {
					attached = time.Since(created)
				}
				return attached != 0 && tc.killNow(t, pv, volume)
			}, 2*time.Minute, 5*time.Millisecond, "the Pod's start reaches the kill point")
			p := env.cluster.CSIProcess(plugin)
			require.NotNil(t, p)
			require.NoError(t, p.Kill())
			killed := time.Since(created)
			t.Cleanup(func() { ensureCSIRunning(t) })
			require.False(t, podReady(getPod(t, pod.Name)), "the Pod was not running yet when its node plugin was killed")
			t.Logf("%s killed %s after the Pod's creation (VolumeAttachment attached after %s); on the node: mounts %v, nbdfuse %v",
				plugin, killed.Round(time.Millisecond), attached.Round(time.Millisecond),
				append(localcluster.MountsUnder(stateDir), localcluster.MountsUnder(filepath.Join(node.KubeletRoot(), "plugins/kubernetes.io/csi"))...),
				localcluster.NBDFuseProcesses(stateDir))
			time.Sleep(time.Second)
			require.NoError(t, env.cluster.RestartCSI(plugin))

			running := waitPodRunning(t, pod.Name)
			t.Logf("Pod Running %s after its creation", running.Sub(created).Round(time.Millisecond))
			assert.Equal(t, "written", strings.TrimSpace(kubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "cat", "/data/f")))
			kubectl(t, "-n", podNamespace, "exec", pod.Name, "--", "sh", "-c", "echo more >> /data/f; sync")
			assert.Equal(t, "node-2", getVolume(t, volume).Status.CurrentNodeID)
			assert.Len(t, loopsOnTheInstanceManagersFile(volume), 1, "one loop device, on the instance manager's file")
			assert.Empty(t, localcluster.NBDFuseProcesses(stateDir), "no nbdfuse: the instance manager serves the volume as a file")

			deletePod(t, pod.Name)
			require.NoError(t, env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Delete(ctx, pvc.Name, metav1.DeleteOptions{}))
			waitVolumeGone(t, volume)
			assertNoTraceOfVolume(t, node, volume, loopsBefore)
			newCSINodeClient(t, 1).assertNothingLeft(t)
		})
	}
}

// loopsOnTheInstanceManagersFile lists the loop devices on the file node-2's
// instance manager serves volume as.
func loopsOnTheInstanceManagersFile(volume string) []string {
	file := engineapi.FUSEFile(env.managerOpts.FUSEDir("node-2"), volume)
	return localcluster.LoopDevicesOn(func(backing string) bool { return backing == file })
}

// storageAttached says whether Kubernetes' VolumeAttachment of the PV on
// the node is attached.
func storageAttached(t *testing.T, pv, node string) bool {
	vas, err := env.adminKube.StorageV1().VolumeAttachments().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	for _, va := range vas.Items {
		if va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == pv &&
			va.Spec.NodeName == node && va.Status.Attached {
			return true
		}
	}
	return false
}

// The manager that is to own a new claim's volume killed right after the
// claim is created, so that CreateVolume makes the volume while its owner is
// down and waits for it to be scheduled (or, when that manager also led the
// admission webhooks, waits for them to fail over before it can make the
// volume at all); the manager is started again in the middle of that. The
// volume converges, the claim binds to it, with one volume for the claim and
// the replica count asked for.
func TestManagerKilledDuringCreateVolume(t *testing.T) {
	ctx := context.Background()
	require.Eventually(t, func() bool {
		for _, n := range nodeNames {
			if nodeReady(t, n) != metav1.ConditionTrue {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "every node Ready, so the volume's owner is known")
	pvc := createPVC(t, "fault-manager", "64Mi")
	created, err := env.adminKube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, pvc.Name, metav1.GetOptions{})
	require.NoError(t, err)
	// csi-provisioner names the volume pvc-<claim uid>; with every node
	// alive, its owner is the one rendezvous hashing picks.
	name := "pvc-" + string(created.UID)
	owner := volumeOwnerWhenAllAlive(name)
	mgr := env.managers[owner]
	leader := webhookLeader(t)
	require.NoError(t, mgr.Kill())
	killed := time.Now()
	t.Cleanup(func() {
		if env.managers[owner].Exited() {
			if m, err := env.managers[owner].Restart(env.managerOpts); err == nil {
				env.managers[owner] = m
			}
		}
	})
	// CreateVolume is under way once the volume exists: at once, or, when
	// the killed manager also led the admission webhooks, once a peer took
	// the lead. Who may reconcile a volume while its owner's lease runs is
	// the ownership unit tests' (controller/kit/ownership_test.go), not a wait
	// here.
	vol := waitClaimVolumeCR(t, pvc.Name, func(*v1beta1.Volume) bool { return true })
	require.Equal(t, name, vol.Name)
	t.Logf("manager %s killed (webhook leader %s); volume %s made %s later, owner %q", owner, leader, name,
		time.Since(killed).Round(time.Millisecond), vol.Status.OwnerID)
	restarted, err := mgr.Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers[owner] = restarted

	start := time.Now()
	volume := boundVolume(t, pvc)
	t.Logf("claim bound %s after the restart (%s after the kill)", time.Since(start).Round(time.Millisecond),
		time.Since(killed).Round(time.Millisecond))
	assert.Equal(t, name, volume, "bound to the volume made while the owner was down")
	assert.Equal(t, []string{volume}, volumesOfClaim(t, pvc.Name), "exactly one volume for the claim")
	v := waitVolume(t, volume, time.Minute, "detached", isDetached)
	require.Eventually(t, func() bool {
		live := 0
		for _, r := range replicasOf(t, volume) {
			if r.DeletionTimestamp == nil {
				live++
			}
		}
		return live == int(v.Spec.NumberOfReplicas)
	}, time.Minute, 250*time.Millisecond, "the volume has the %d replicas asked for, no more", v.Spec.NumberOfReplicas)
}

// volumeOwnerWhenAllAlive is the manager that reconciles a new volume while
// every node is alive: the rendezvous hash of its queue key over the nodes,
// as controller/kit/ownership.go's ResponsibleNode picks it.
func volumeOwnerWhenAllAlive(volume string) string {
	best, bestScore := "", uint64(0)
	for _, n := range nodeNames {
		h := fnv.New64a()
		_, _ = h.Write([]byte(ns + "/" + volume))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(n))
		if score := h.Sum64(); best == "" || score > bestScore {
			best, bestScore = n, score
		}
	}
	return best
}

// waitClaimVolumeCR waits, polling fast, for the Strata volume the driver
// makes for the claim to satisfy cond, and returns it.
func waitClaimVolumeCR(t *testing.T, claim string, cond func(*v1beta1.Volume) bool) *v1beta1.Volume {
	t.Helper()
	var found *v1beta1.Volume
	require.Eventually(t, func() bool {
		for _, name := range volumesOfClaim(t, claim) {
			if v, err := env.adminStrata.StrataV1beta1().Volumes(ns).Get(context.Background(), name, metav1.GetOptions{}); err == nil && cond(v) {
				found = v
				return true
			}
		}
		return false
	}, 2*time.Minute, 10*time.Millisecond, "the driver makes a volume for claim %s", claim)
	return found
}

// killCSIController kills the controller plugin with SIGKILL; whatever the
// test leaves down is started again when it ends.
func killCSIController(t *testing.T) {
	t.Helper()
	p := env.cluster.CSIProcess("csi-controller")
	require.NotNil(t, p, "the controller plugin runs")
	require.NoError(t, p.Kill())
	t.Cleanup(func() { ensureCSIRunning(t) })
}

// restartCSIController starts the controller plugin and its sidecars again.
func restartCSIController(t *testing.T) {
	t.Helper()
	require.NoError(t, env.cluster.RestartCSIController(10*time.Second))
}

// ensureCSIRunning starts again every CSI process a failed test left down.
func ensureCSIRunning(t *testing.T) {
	if env.cluster.CSIProcess("csi-controller") == nil {
		restartCSIController(t)
	}
	names := append([]string{}, localcluster.CSISidecars...)
	for _, n := range nodeNames {
		names = append(names, "csi-node-"+n)
	}
	for _, name := range names {
		if env.cluster.CSIProcess(name) == nil {
			assert.NoError(t, env.cluster.RestartCSI(name), "restarting %s", name)
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// The seed's user story: a replica that failed because its node went down
// (manager and instance manager killed, as a reboot would) is reused when
// the node comes back with the data still on its disk — the same replica
// CR, rebuilt from what it already holds — rather than replaced by a new,
// fully copied one. The volume's data is intact when read from that
// replica alone.
func TestFailedReplicaReusedAfterNodeReboot(t *testing.T) {
	restore := setSetting(t, types.SettingReplicaReplenishmentWaitInterval, "600")
	defer restore()
	waitDataPlanesRunning(t)
	createVolume(t, "e2e-reuse", "64Mi", 3)
	updateTickets(t, "e2e-reuse", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-reuse", 2*time.Minute, "attached to node-1", attachedTo("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x11 0 32M")
	// What a snapshot holds is what a returning replica can keep (its head
	// is stale once it missed writes).
	createSnapshot(t, "e2e-reuse", "e2e-reuse-s1")
	waitSnapshotsReady(t, "e2e-reuse", 1, time.Minute)
	victim := replicaOn(t, "e2e-reuse", "node-3")

	mgr := env.managers["node-3"]
	require.NoError(t, mgr.IM.Kill())
	require.NoError(t, mgr.Kill())
	back := false
	t.Cleanup(func() { // the next tests need node-3, whatever happened here
		if !back {
			if im, err := startIMAgain(mgr); err == nil {
				mgr.IM = im
			}
			if m, err := mgr.Restart(env.managerOpts); err == nil {
				env.managers["node-3"] = m
			}
		}
	})
	// The engine finds the replica gone at the next write and marks it ERR
	// (a node whose manager alone is down keeps its replicas).
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x22 8M 2M")
	waitReplica(t, victim.Name, time.Minute, "failed", func(r *v1beta1.Replica) bool { return r.Spec.FailedAt != "" })

	im, err := startIMAgain(mgr)
	require.NoError(t, err)
	mgr.IM = im
	restarted, err := mgr.Restart(env.managerOpts)
	require.NoError(t, err)
	env.managers["node-3"] = restarted
	back = true

	var rebuild v1beta1.RebuildStatus
	r := waitReplica(t, victim.Name, 2*time.Minute, "reused and rebuilt", func(r *v1beta1.Replica) bool {
		for _, e := range enginesOf(t, "e2e-reuse") {
			if st := e.Status.RebuildStatus[victim.Name]; st != nil && st.State == "complete" {
				rebuild = *st
			}
		}
		return r.Spec.FailedAt == "" && r.Spec.HealthyAt != ""
	})
	assert.Equal(t, victim.Spec.DataDirectoryName, r.Spec.DataDirectoryName, "the same data directory")
	t.Logf("rebuild of the returning replica: copied %d bytes in %d layers, kept %d bytes in %d layers",
		rebuild.CopiedBytes, rebuild.CopiedLayers, rebuild.KeptBytes, rebuild.KeptLayers)
	assert.GreaterOrEqual(t, rebuild.KeptBytes, int64(32<<20), "the snapshot it held was kept")
	assert.Less(t, rebuild.CopiedBytes, int64(8<<20), "only what changed since was copied")
	waitEventIn(t, ns, "Volume", "e2e-reuse", "ReplicaReused", []string{victim.Name}, 10*time.Second)
	assert.Len(t, replicasOf(t, "e2e-reuse"), 3, "no replica was added in its place")

	readFromOnly(t, "e2e-reuse", "node-3", "read -P 0x11 0 8M", "read -P 0x22 8M 2M", "read -P 0x11 10M 22M")
}

// The seed's "disk migration" plan: a 3-replica volume on a backing image,
// node-3's replica on an extra disk; node-3's instance manager dies and the
// disk is remounted at another path (the directory moves) and added to the
// node there. The new entry is the same disk (same UUID file): the old path
// turns unschedulable (DiskMigrated), the replica follows the disk to its
// new path and is reused, the backing image's copy there is reused (the
// same file), and the data is intact read from that replica alone.
func TestDiskMigrationReusesReplicaAndImageCopy(t *testing.T) {
	srv := startImageServer(t)
	rawPath, sum := rawTestImage(t, srv.dir, "mig.raw", 8<<20)
	raw, err := os.ReadFile(rawPath)
	require.NoError(t, err)
	createBackingImage(t, "e2e-bi-mig", downloadSpec(srv.url+"/mig.raw", sum))
	restore := setSetting(t, types.SettingReplicaReplenishmentWaitInterval, "600")
	defer restore()

	_, defaultDisk := diskOf(t, "node-3")
	extra := filepath.Join(filepath.Dir(defaultDisk), "disk-extra")
	moved := filepath.Join(filepath.Dir(defaultDisk), "disk-moved")
	require.NoError(t, os.MkdirAll(extra, 0o755))
	editNode(t, "node-3", func(n *v1beta1.Node) {
		d := n.Spec.Disks["disk-1"]
		d.AllowScheduling = false
		n.Spec.Disks["disk-1"] = d
		n.Spec.Disks["extra"] = v1beta1.DiskSpec{Path: extra, AllowScheduling: true}
	})
	t.Cleanup(func() {
		editNode(t, "node-3", func(n *v1beta1.Node) {
			delete(n.Spec.Disks, "extra")
			delete(n.Spec.Disks, "moved")
			d := n.Spec.Disks["disk-1"]
			d.AllowScheduling = true
			n.Spec.Disks["disk-1"] = d
		})
	})
	extraUUID := waitDiskUUID(t, "node-3", "extra")
	waitDataPlanesRunning(t) // one replica per node: every node must take one

	createVolume(t, "e2e-mig", "32Mi", 3, func(v *v1beta1.Volume) { v.Spec.BackingImage = "e2e-bi-mig" })
	updateTickets(t, "e2e-mig", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-mig", 2*time.Minute, "attached to node-1", attachedTo("node-1"))
	victim := replicaOn(t, "e2e-mig", "node-3")
	require.Equal(t, extraUUID, victim.Spec.DiskID, "node-3's replica is on the extra disk")
	bi := waitBackingImage(t, "e2e-bi-mig", time.Minute, "copies on 3 disks", allCopiesReady(3))
	copyAtExtra := filepath.Join(extra, "backing-images", bi.Name+"-"+bi.Status.UUID, "backing")
	copyInode := inode(t, copyAtExtra)
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x33 1M 2M")
	createSnapshot(t, "e2e-mig", "e2e-mig-s1")
	waitSnapshotsReady(t, "e2e-mig", 1, time.Minute)

	// The disk goes away: the instance manager dies with it, the directory moves.
	mgr := env.managers["node-3"]
	require.NoError(t, mgr.IM.Kill())
	imBack := false
	t.Cleanup(func() {
		if !imBack {
			if im, err := startIMAgain(mgr); err == nil {
				mgr.IM = im
			}
		}
	})
	require.NoError(t, os.Rename(extra, moved))
	// The engine learns of the loss at the next write, and marks it ERR.
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x44 4M 1M")
	waitReplica(t, victim.Name, time.Minute, "failed", func(r *v1beta1.Replica) bool { return r.Spec.FailedAt != "" })
	im, err := startIMAgain(mgr)
	require.NoError(t, err)
	mgr.IM = im
	imBack = true

	// Remounted at another path and added there.
	editNode(t, "node-3", func(n *v1beta1.Node) {
		n.Spec.Disks["moved"] = v1beta1.DiskSpec{Path: moved, AllowScheduling: true}
	})
	waitNode(t, "node-3", time.Minute, "the old entry DiskMigrated", func(n *v1beta1.Node) bool {
		old := n.Status.DiskStatus["extra"]
		return old != nil && meta.FindStatusCondition(old.Conditions, v1beta1.ConditionTypeSchedulable) != nil &&
			meta.FindStatusCondition(old.Conditions, v1beta1.ConditionTypeReady).Reason == v1beta1.DiskConditionReasonMigrated &&
			n.Status.DiskStatus["moved"] != nil && n.Status.DiskStatus["moved"].DiskUUID == extraUUID &&
			meta.IsStatusConditionTrue(n.Status.DiskStatus["moved"].Conditions, v1beta1.ConditionTypeSchedulable)
	})
	var rebuild v1beta1.RebuildStatus
	r := waitReplica(t, victim.Name, 2*time.Minute, "reused at the new path and rebuilt", func(r *v1beta1.Replica) bool {
		for _, e := range enginesOf(t, "e2e-mig") {
			if st := e.Status.RebuildStatus[victim.Name]; st != nil && st.State == "complete" {
				rebuild = *st
			}
		}
		return r.Spec.FailedAt == "" && r.Spec.HealthyAt != "" && r.Spec.DiskPath == moved
	})
	t.Logf("rebuild of the migrated replica: copied %d bytes in %d layers, kept %d bytes in %d layers",
		rebuild.CopiedBytes, rebuild.CopiedLayers, rebuild.KeptBytes, rebuild.KeptLayers)
	assert.GreaterOrEqual(t, rebuild.KeptLayers, int32(1), "the snapshot it held was kept")
	assert.Equal(t, "moved", r.Spec.DiskName)
	assert.Len(t, replicasOf(t, "e2e-mig"), 3, "no replica was added in its place")
	bi = waitBackingImage(t, "e2e-bi-mig", time.Minute, "the moved disk's copy ready", allCopiesReady(3))
	copyAtMoved := filepath.Join(moved, "backing-images", bi.Name+"-"+bi.Status.UUID, "backing")
	assert.Equal(t, copyInode, inode(t, copyAtMoved), "the image's copy was reused, not fetched again")
	assert.Equal(t, sum, fileSHA512(t, copyAtMoved))

	want := append([]byte(nil), raw...)
	want = append(want, make([]byte, (32<<20)-len(raw))...)
	fill := func(off, n int, b byte) {
		for i := off; i < off+n; i++ {
			want[i] = b
		}
	}
	fill(1<<20, 2<<20, 0x33)
	fill(4<<20, 1<<20, 0x44)
	v = readFromOnlyEndpoint(t, "e2e-mig", "node-3")
	assertVolumeHoldsImage(t, v.Status.FrontendEndpoint, want)
}

// startIMAgain starts a node's instance manager again on the same state
// and addresses, as after a reboot.
func startIMAgain(mgr *localcluster.Manager) (*localcluster.InstanceManager, error) {
	return localcluster.StartInstanceManager(env.managerOpts, mgr.Node, mgr.IM)
}

func replicaOn(t *testing.T, volume, node string) v1beta1.Replica {
	t.Helper()
	for _, r := range replicasOf(t, volume) {
		if r.Spec.NodeID == node {
			return r
		}
	}
	t.Fatalf("volume %s has no replica on %s", volume, node)
	return v1beta1.Replica{}
}

func waitReplica(t *testing.T, name string, timeout time.Duration, what string, cond func(*v1beta1.Replica) bool) *v1beta1.Replica {
	t.Helper()
	var last *v1beta1.Replica
	ok := false
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		r, err := env.adminStrata.StrataV1beta1().Replicas(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		if last = r; cond(r) {
			ok = true
			break
		}
	}
	require.True(t, ok, "replica %s: %s within %s; last: %+v %+v", name, what, timeout, last.Spec, last.Status)
	return last
}

func editNode(t *testing.T, name string, edit func(*v1beta1.Node)) {
	t.Helper()
	require.NoError(t, retryOnConflict(func() error {
		n, err := env.adminStrata.StrataV1beta1().Nodes(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(n)
		_, err = env.adminStrata.StrataV1beta1().Nodes(ns).Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	}))
}

func waitNode(t *testing.T, name string, timeout time.Duration, what string, cond func(*v1beta1.Node) bool) *v1beta1.Node {
	t.Helper()
	var last *v1beta1.Node
	require.Eventually(t, func() bool {
		n, err := env.adminStrata.StrataV1beta1().Nodes(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = n
		return cond(n)
	}, timeout, 200*time.Millisecond, "node %s: %s", name, what)
	return last
}

func waitDiskUUID(t *testing.T, node, disk string) string {
	t.Helper()
	n := waitNode(t, node, time.Minute, "disk "+disk+" has a UUID", func(n *v1beta1.Node) bool {
		st := n.Status.DiskStatus[disk]
		return st != nil && st.DiskUUID != "" && meta.IsStatusConditionTrue(st.Conditions, v1beta1.ConditionTypeSchedulable)
	})
	return n.Status.DiskStatus[disk].DiskUUID
}

// readFromOnlyEndpoint leaves the volume with its replica on node alone
// (the others' nodes stop scheduling, their replicas go) and returns the
// volume once it serves from it.
func readFromOnlyEndpoint(t *testing.T, volume, node string) *v1beta1.Volume {
	t.Helper()
	for _, n := range nodeNames {
		if n == node {
			continue
		}
		setNodeScheduling(t, n, false)
		t.Cleanup(func() { setNodeScheduling(t, n, true) })
	}
	for _, r := range replicasOf(t, volume) {
		if r.Spec.NodeID != node {
			require.NoError(t, deleteReplica(r.Name))
		}
	}
	return waitVolume(t, volume, 2*time.Minute, "one replica, on "+node, func(v *v1beta1.Volume) bool {
		reps := replicasOf(t, volume)
		return len(reps) == 1 && reps[0].Spec.NodeID == node && v.Status.FrontendEndpoint != ""
	})
}

// readFromOnly runs qemu-io commands on the volume served by its replica on
// node alone.
func readFromOnly(t *testing.T, volume, node string, cmds ...string) {
	t.Helper()
	v := readFromOnlyEndpoint(t, volume, node)
	qemuIO(t, v.Status.FrontendEndpoint, cmds...)
}

func enginesOf(t *testing.T, volume string) []v1beta1.Engine {
	t.Helper()
	list, err := env.adminStrata.StrataV1beta1().Engines(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: types.LabelVolume + "=" + volume})
	require.NoError(t, err)
	return list.Items
}

// waitDataPlanesRunning waits until every node's instance manager runs (an
// earlier test may have just restarted one).
func waitDataPlanesRunning(t *testing.T) {
	t.Helper()
	for _, n := range nodeNames {
		require.Eventually(t, func() bool {
			st, _ := imState(t, n)
			return st == v1beta1.InstanceStateRunning
		}, time.Minute, 100*time.Millisecond, "im-%s running", n)
	}
}

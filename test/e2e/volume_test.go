package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/scripts/localcluster"
	stypes "github.com/strata-storage/strata/types"
)

// A 3-replica volume created with kubectl comes up detached with its
// replicas on three nodes and a VolumeAttachment; a strata-api ticket added
// with kubectl patch attaches it where it asks, the NBD endpoint serves data,
// and removing the ticket detaches it.
func TestVolumeAttachDetachByTicket(t *testing.T) {
	manifest := filepath.Join(t.TempDir(), "v.yaml")
	require.NoError(t, os.WriteFile(manifest, []byte(`apiVersion: strata.io/v1beta1
kind: Volume
metadata: {name: e2e-v1, namespace: strata-system}
spec: {size: 64Mi, numberOfReplicas: 3}
`), 0o644))
	kubectl(t, "apply", "-f", manifest)
	t.Cleanup(func() { deleteVolume(t, "e2e-v1") })
	waitVolume(t, "e2e-v1", time.Minute, "detached and healthy", func(v *v1beta1.Volume) bool {
		return isDetached(v) && v.Status.Robustness == v1beta1.VolumeRobustnessHealthy
	})
	nodes := map[string]bool{}
	for _, r := range replicasOf(t, "e2e-v1") {
		nodes[r.Spec.NodeID] = true
	}
	assert.Len(t, nodes, 3, "three replicas on three distinct nodes")
	assert.Equal(t, "e2e-v1", getVA(t, "e2e-v1").Spec.Volume)

	kubectl(t, "-n", ns, "patch", "va", "e2e-v1", "--type", "merge", "-p",
		`{"spec":{"attachmentTickets":{"admin":{"id":"admin","type":"strata-api","nodeID":"node-2","parameters":{}}}}}`)
	v := waitVolume(t, "e2e-v1", time.Minute, "attached to node-2", attachedTo("node-2"))
	require.NotEmpty(t, v.Status.FrontendEndpoint)
	assert.Equal(t, "node-2", v.Spec.NodeID)
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x5a 0 4M", "read -P 0x5a 0 4M")
	require.Eventually(t, func() bool {
		st := getVA(t, "e2e-v1").Status.AttachmentTicketStatuses["admin"]
		return st != nil && st.Satisfied
	}, 30*time.Second, 100*time.Millisecond, "the ticket is satisfied")
	out := kubectl(t, "-n", ns, "get", "vol", "e2e-v1")
	assert.Regexp(t, `e2e-v1\s+attached\s+healthy\s+3\s+64Mi\s+node-2`, out)

	kubectl(t, "-n", ns, "patch", "va", "e2e-v1", "--type", "json", "-p", `[{"op":"remove","path":"/spec/attachmentTickets/admin"}]`)
	waitVolume(t, "e2e-v1", time.Minute, "detached after the ticket went", isDetached)

	// Attached again elsewhere, the data is there.
	updateTickets(t, "e2e-v1", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-3"))
	v = waitVolume(t, "e2e-v1", time.Minute, "attached to node-3", attachedTo("node-3"))
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x5a 0 4M")
	updateTickets(t, "e2e-v1", removeTicket("admin"))
	waitVolume(t, "e2e-v1", time.Minute, "detached", isDetached)
}

// A snapshot ticket yields to a CSI ticket on another node, and the ticket
// statuses say why; a restore ticket beats both.
func TestTicketPriorities(t *testing.T) {
	createVolume(t, "e2e-prio", "16Mi", 2)
	waitVolume(t, "e2e-prio", time.Minute, "detached", isDetached)

	updateTickets(t, "e2e-prio", addTicket("snap-1", v1beta1.AttacherTypeSnapshotController, "node-1"))
	waitVolume(t, "e2e-prio", time.Minute, "attached for the snapshot on node-1", attachedTo("node-1"))
	updateTickets(t, "e2e-prio", addTicket("pod-1", v1beta1.AttacherTypeCSIAttacher, "node-2"))
	waitVolume(t, "e2e-prio", time.Minute, "moved to the CSI ticket's node-2", attachedTo("node-2"))
	require.Eventually(t, func() bool {
		sts := getVA(t, "e2e-prio").Status.AttachmentTicketStatuses
		return sts["pod-1"] != nil && sts["pod-1"].Satisfied && sts["snap-1"] != nil && !sts["snap-1"].Satisfied
	}, 30*time.Second, 100*time.Millisecond)
	snap := getVA(t, "e2e-prio").Status.AttachmentTicketStatuses["snap-1"]
	c := meta.FindStatusCondition(snap.Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied)
	require.NotNil(t, c)
	t.Logf("snapshot ticket: %s: %s", c.Reason, c.Message)
	assert.NotEmpty(t, c.Reason)
	assert.Contains(t, c.Message, "node-2", "the status says where the volume is instead")

	// From detached, a restore ticket wins over a CSI and a snapshot ticket.
	updateTickets(t, "e2e-prio", removeTicket("snap-1", "pod-1"))
	waitVolume(t, "e2e-prio", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-prio", func(m map[string]*v1beta1.AttachmentTicket) {
		addTicket("snap-1", v1beta1.AttacherTypeSnapshotController, "node-1")(m)
		addTicket("pod-1", v1beta1.AttacherTypeCSIAttacher, "node-2")(m)
		addTicket("restore", v1beta1.AttacherTypeVolumeRestoreController, "node-3")(m)
	})
	waitVolume(t, "e2e-prio", time.Minute, "attached for the restore on node-3", attachedTo("node-3"))
	updateTickets(t, "e2e-prio", removeTicket("restore"))
	waitVolume(t, "e2e-prio", time.Minute, "then for the CSI ticket on node-2", attachedTo("node-2"))
	updateTickets(t, "e2e-prio", removeTicket("snap-1", "pod-1"))
	waitVolume(t, "e2e-prio", time.Minute, "detached", isDetached)
}

// Seed story 1: reattach requests and CSI attach/detach racing each other
// never leave the volume where the controllers cannot bring it back.
func TestTicketRacesAlwaysResolve(t *testing.T) {
	createVolume(t, "e2e-race", "16Mi", 2)
	waitVolume(t, "e2e-race", time.Minute, "detached", isDetached)
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 100; i++ {
		node := nodeNames[rng.Intn(len(nodeNames))]
		switch rng.Intn(4) {
		case 0:
			updateTickets(t, "e2e-race", addTicket("csi", v1beta1.AttacherTypeCSIAttacher, node))
		case 1:
			updateTickets(t, "e2e-race", removeTicket("csi"))
		case 2:
			updateTickets(t, "e2e-race", addTicket("reattach", v1beta1.AttacherTypeStrataAPI, node))
		case 3:
			updateTickets(t, "e2e-race", removeTicket("reattach"))
		}
		if i%25 == 24 {
			// Settle: whatever the tickets say now is where the volume ends.
			va := getVA(t, "e2e-race")
			want := ""
			if tk := va.Spec.AttachmentTickets["reattach"]; tk != nil {
				want = tk.NodeID
			} else if tk := va.Spec.AttachmentTickets["csi"]; tk != nil {
				want = tk.NodeID
			}
			if want == "" {
				waitVolume(t, "e2e-race", 2*time.Minute, fmt.Sprintf("detached after %d racing changes", i+1), isDetached)
			} else {
				waitVolume(t, "e2e-race", 2*time.Minute, fmt.Sprintf("on %s after %d racing changes", want, i+1), func(v *v1beta1.Volume) bool {
					// A strata-api ticket wins only from detached; the volume
					// ends on one of the tickets' nodes.
					return v.Status.State == v1beta1.VolumeStateAttached && ticketWants(va, v.Status.CurrentNodeID)
				})
			}
		} else {
			time.Sleep(time.Duration(rng.Intn(50)) * time.Millisecond)
		}
	}
	updateTickets(t, "e2e-race", removeTicket("csi", "reattach"))
	waitVolume(t, "e2e-race", 2*time.Minute, "detached at the end", isDetached)
}

func ticketWants(va *v1beta1.VolumeAttachment, node string) bool {
	for _, tk := range va.Spec.AttachmentTickets {
		if tk.NodeID == node {
			return true
		}
	}
	return false
}

// Killing the instance manager that holds one replica while data is being
// written: the volume goes degraded, a new replica replaces the lost one and
// is rebuilt, the volume is healthy again, and every byte reads back.
func TestReplicaLossIsRebuilt(t *testing.T) {
	defer setSetting(t, stypes.SettingReplicaReplenishmentWaitInterval, "1")()
	createVolume(t, "e2e-rebuild", "64Mi", 3)
	waitVolume(t, "e2e-rebuild", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-rebuild", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-rebuild", time.Minute, "attached to node-1", attachedTo("node-1"))
	ep := v.Status.FrontendEndpoint
	qemuIO(t, ep, "write -P 0x11 0 16M")

	victim := ""
	for _, r := range replicasOf(t, "e2e-rebuild") {
		if r.Spec.NodeID != "node-1" {
			victim = r.Spec.NodeID
			break
		}
	}
	require.NotEmpty(t, victim)
	mgr := env.managers[victim]
	done := make(chan error, 1)
	go func() {
		// Writes keep coming while the replica is lost.
		for i := 0; i < 8; i++ {
			if _, err := runQemuIO(ep, fmt.Sprintf("write -P 0x22 %dM 2M", 16+2*i)); err != nil {
				done <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		done <- nil
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, mgr.IM.Kill())
	require.NoError(t, <-done, "writes go on while a replica is lost")
	waitVolume(t, "e2e-rebuild", time.Minute, "degraded", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessDegraded
	})
	restarted, err := localcluster.StartInstanceManager(env.managerOpts, victim, mgr.IM)
	require.NoError(t, err)
	mgr.IM = restarted
	waitVolume(t, "e2e-rebuild", 2*time.Minute, "healthy after the rebuild", func(v *v1beta1.Volume) bool {
		return v.Status.Robustness == v1beta1.VolumeRobustnessHealthy && v.Status.State == v1beta1.VolumeStateAttached
	})
	reps := replicasOf(t, "e2e-rebuild")
	live := 0
	for _, r := range reps {
		if r.DeletionTimestamp == nil && r.Spec.FailedAt == "" {
			live++
		}
	}
	assert.Equal(t, 3, live, "three healthy replicas")
	qemuIO(t, ep, "read -P 0x11 0 16M", "read -P 0x22 16M 16M")

	// The rebuilt replica holds the data too: detach, attach on its node... each
	// replica alone must read back the same, so check by reattaching.
	updateTickets(t, "e2e-rebuild", removeTicket("admin"))
	waitVolume(t, "e2e-rebuild", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-rebuild", addTicket("admin", v1beta1.AttacherTypeStrataAPI, victim))
	v = waitVolume(t, "e2e-rebuild", time.Minute, "attached to "+victim, attachedTo(victim))
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x11 0 16M", "read -P 0x22 16M 16M")
}

// Upgrade path: a volume without a VolumeAttachment gets one; an attached
// volume gets a ticket that keeps it attached.
func TestVolumeAttachmentUpgradePath(t *testing.T) {
	ctx := context.Background()
	createVolume(t, "e2e-upg", "16Mi", 2)
	waitVolume(t, "e2e-upg", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-upg", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-3"))
	waitVolume(t, "e2e-upg", time.Minute, "attached to node-3", attachedTo("node-3"))

	// As if the volume predated VolumeAttachments.
	old := getVA(t, "e2e-upg")
	require.NoError(t, env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Delete(ctx, "e2e-upg", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		va, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Get(ctx, "e2e-upg", metav1.GetOptions{})
		return err == nil && va.UID != old.UID && len(va.Spec.AttachmentTickets) == 1
	}, 30*time.Second, 100*time.Millisecond, "a new VolumeAttachment with a ticket")
	for _, tk := range getVA(t, "e2e-upg").Spec.AttachmentTickets {
		assert.Equal(t, "node-3", tk.NodeID)
	}
	time.Sleep(2 * time.Second)
	assert.True(t, attachedTo("node-3")(getVolume(t, "e2e-upg")), "the volume stayed attached")

	// A detached volume without one gets an empty VolumeAttachment.
	createVolume(t, "e2e-upg2", "16Mi", 1)
	waitVolume(t, "e2e-upg2", time.Minute, "detached", isDetached)
	old = getVA(t, "e2e-upg2")
	require.NoError(t, env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Delete(ctx, "e2e-upg2", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		va, err := env.adminStrata.StrataV1beta1().VolumeAttachments(ns).Get(ctx, "e2e-upg2", metav1.GetOptions{})
		return err == nil && va.UID != old.UID && len(va.Spec.AttachmentTickets) == 0
	}, 30*time.Second, 100*time.Millisecond, "a new VolumeAttachment without tickets")
	assert.True(t, isDetached(getVolume(t, "e2e-upg2")))
}

// Reaper: a ticket owned by a Snapshot holds a detached volume attached;
// deleting the Snapshot removes the ticket and the volume detaches.
func TestReaperRemovesTicketsOfDeletedOwners(t *testing.T) {
	ctx := context.Background()
	createVolume(t, "e2e-reap", "16Mi", 2)
	waitVolume(t, "e2e-reap", time.Minute, "detached", isDetached)
	snap, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Create(ctx, &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-reap-snap", Namespace: ns},
		Spec:       v1beta1.SnapshotSpec{Volume: "e2e-reap", CreateSnapshot: true},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	updateTickets(t, "e2e-reap", func(m map[string]*v1beta1.AttachmentTicket) {
		m["snap"] = &v1beta1.AttachmentTicket{ID: "snap", Type: v1beta1.AttacherTypeSnapshotController, NodeID: "node-2",
			Parameters: map[string]string{}, OwnerRef: &v1beta1.TicketOwnerReference{APIVersion: "strata.io/v1beta1",
				Kind: "Snapshot", Namespace: ns, Name: snap.Name, UID: string(snap.UID)}}
	})
	waitVolume(t, "e2e-reap", time.Minute, "attached for the snapshot", attachedTo("node-2"))
	waitSnapshotsReady(t, "e2e-reap", 1, time.Minute)

	require.NoError(t, env.adminStrata.StrataV1beta1().Snapshots(ns).Delete(ctx, snap.Name, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, ok := getVA(t, "e2e-reap").Spec.AttachmentTickets["snap"]
		return !ok
	}, 30*time.Second, 100*time.Millisecond, "the orphaned ticket is removed")
	waitVolume(t, "e2e-reap", time.Minute, "detached once its ticket went", isDetached)
}

// Live migration: a migratable volume holds a second CSI ticket on another
// node; a second engine starts there over the same replicas, and when the
// first ticket goes the volume switches to it with its data.
func TestLiveMigration(t *testing.T) {
	createVolume(t, "e2e-mig", "16Mi", 2, func(v *v1beta1.Volume) { v.Spec.Migratable = true })
	waitVolume(t, "e2e-mig", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-mig", addTicket("pod-src", v1beta1.AttacherTypeCSIAttacher, "node-1"))
	v := waitVolume(t, "e2e-mig", time.Minute, "attached to node-1", attachedTo("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x33 0 4M")

	updateTickets(t, "e2e-mig", addTicket("pod-dst", v1beta1.AttacherTypeCSIAttacher, "node-2"))
	v = waitVolume(t, "e2e-mig", time.Minute, "migration engine running on node-2", func(v *v1beta1.Volume) bool {
		return attachedTo("node-1")(v) && v.Spec.MigrationNodeID == "node-2" && v.Status.CurrentMigrationNodeID == "node-2"
	})
	require.Eventually(t, func() bool {
		st := getVA(t, "e2e-mig").Status.AttachmentTicketStatuses
		return st["pod-src"] != nil && st["pod-src"].Satisfied && st["pod-dst"] != nil && st["pod-dst"].Satisfied
	}, 30*time.Second, 100*time.Millisecond, "both CSI tickets are satisfied during the migration")

	updateTickets(t, "e2e-mig", removeTicket("pod-src"))
	v = waitVolume(t, "e2e-mig", time.Minute, "switched to node-2", func(v *v1beta1.Volume) bool {
		return attachedTo("node-2")(v) && v.Spec.MigrationNodeID == "" && v.Status.CurrentMigrationNodeID == ""
	})
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x33 0 4M")
	engines, err := env.adminStrata.StrataV1beta1().Engines(ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: stypes.LabelVolume + "=e2e-mig"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		engines, err = env.adminStrata.StrataV1beta1().Engines(ns).List(context.Background(),
			metav1.ListOptions{LabelSelector: stypes.LabelVolume + "=e2e-mig"})
		return err == nil && len(engines.Items) == 1
	}, 30*time.Second, 100*time.Millisecond, "the old engine is gone")
	assert.Equal(t, "node-2", engines.Items[0].Spec.NodeID)
	updateTickets(t, "e2e-mig", removeTicket("pod-dst"))
	waitVolume(t, "e2e-mig", time.Minute, "detached", isDetached)
}

// A detached volume grows offline: its replicas are opened at the new size,
// and once attached the whole new size is usable with the old data intact.
func TestOfflineExpansion(t *testing.T) {
	ctx := context.Background()
	createVolume(t, "e2e-grow", "16Mi", 2)
	waitVolume(t, "e2e-grow", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-grow", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-grow", time.Minute, "attached", attachedTo("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x44 0 16M")
	updateTickets(t, "e2e-grow", removeTicket("admin"))
	waitVolume(t, "e2e-grow", time.Minute, "detached", isDetached)

	require.NoError(t, retryOnConflict(func() error {
		v := getVolume(t, "e2e-grow")
		v.Spec.Size = resource.MustParse("48Mi")
		_, err := env.adminStrata.StrataV1beta1().Volumes(ns).Update(ctx, v, metav1.UpdateOptions{})
		return err
	}))
	waitVolume(t, "e2e-grow", time.Minute, "expanded while detached", func(v *v1beta1.Volume) bool {
		return isDetached(v) && v.Status.CurrentSize == 48<<20
	})
	updateTickets(t, "e2e-grow", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-2"))
	v = waitVolume(t, "e2e-grow", time.Minute, "attached", attachedTo("node-2"))
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x44 0 16M", "write -P 0x55 40M 8M", "read -P 0x55 40M 8M")
	updateTickets(t, "e2e-grow", removeTicket("admin"))
	waitVolume(t, "e2e-grow", time.Minute, "detached", isDetached)
}

// Deleting a volume deletes its engine, its replicas and their data
// directories on every node.
func TestVolumeDeleteRemovesReplicaData(t *testing.T) {
	createVolume(t, "e2e-del", "16Mi", 3)
	waitVolume(t, "e2e-del", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-del", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-del", time.Minute, "attached", attachedTo("node-1"))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x66 0 1M")
	var dirs []string
	for _, r := range replicasOf(t, "e2e-del") {
		dir := filepath.Join(env.managers[r.Spec.NodeID].DiskDir, "replicas", r.Spec.DataDirectoryName)
		require.DirExists(t, dir)
		dirs = append(dirs, dir)
	}
	require.Len(t, dirs, 3)
	// Deleting needs the workload ticket gone (the webhook refuses
	// otherwise); the volume is still attached when the delete lands, so
	// the engine is stopped on the way.
	updateTickets(t, "e2e-del", removeTicket("admin"))
	deleteVolume(t, "e2e-del")
	for _, d := range dirs {
		assert.NoDirExists(t, d)
	}
	assert.Empty(t, replicasOf(t, "e2e-del"))
}

// Salvage: every replica of an attached volume is lost (their instance
// managers killed); the volume is faulted and detached, the replicas that
// held the data last are trusted again, and the volume attaches again on
// its node with its data once their instance managers are back.
func TestFaultedVolumeIsSalvaged(t *testing.T) {
	createVolume(t, "e2e-salvage", "16Mi", 2)
	waitVolume(t, "e2e-salvage", time.Minute, "detached", isDetached)
	holders := map[string]bool{}
	for _, r := range replicasOf(t, "e2e-salvage") {
		holders[r.Spec.NodeID] = true
	}
	require.Len(t, holders, 2)
	free := ""
	for _, n := range nodeNames {
		if !holders[n] {
			free = n
		}
	}
	updateTickets(t, "e2e-salvage", addTicket("admin", v1beta1.AttacherTypeStrataAPI, free))
	v := waitVolume(t, "e2e-salvage", time.Minute, "attached where no replica is", attachedTo(free))
	qemuIO(t, v.Status.FrontendEndpoint, "write -P 0x77 0 8M")

	for n := range holders {
		require.NoError(t, env.managers[n].IM.Kill())
	}
	_, _ = runQemuIO(v.Status.FrontendEndpoint, "write -P 0x78 8M 1M") // fails: no replica left
	// Detached to salvage, the volume waits to attach again on its node:
	// nothing can serve until the instance managers are back.
	waitVolume(t, "e2e-salvage", time.Minute, "salvaged after a detach, still asked for on its node", func(v *v1beta1.Volume) bool {
		return v.Status.CurrentNodeID == "" && v.Spec.NodeID == free &&
			meta.IsStatusConditionTrue(v.Status.Conditions, "Salvaged")
	})
	for n := range holders {
		restarted, err := localcluster.StartInstanceManager(env.managerOpts, n, env.managers[n].IM)
		require.NoError(t, err)
		env.managers[n].IM = restarted
	}
	v = waitVolume(t, "e2e-salvage", 2*time.Minute, "salvaged and attached again", attachedTo(free))
	c := meta.FindStatusCondition(v.Status.Conditions, "Salvaged")
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionTrue, c.Status, c.Message)
	qemuIO(t, v.Status.FrontendEndpoint, "read -P 0x77 0 8M")
	updateTickets(t, "e2e-salvage", removeTicket("admin"))
	waitVolume(t, "e2e-salvage", time.Minute, "detached", isDetached)
}

package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/engine/replica"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
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
	// The 4 MiB written, as the data plane reports it (within one 4 KiB block).
	v = waitVolume(t, "e2e-v1", 30*time.Second, "actualSize of the 4 MiB written", func(v *v1beta1.Volume) bool {
		return v.Status.ActualSize >= 4<<20 && v.Status.ActualSize <= 4<<20+4096
	})
	out := kubectl(t, "-n", ns, "get", "vol", "e2e-v1")
	assert.Regexp(t, fmt.Sprintf(`e2e-v1\s+attached\s+healthy\s+3\s+64Mi\s+%d\s+node-2`, v.Status.ActualSize), out)

	kubectl(t, "-n", ns, "patch", "va", "e2e-v1", "--type", "json", "-p", `[{"op":"remove","path":"/spec/attachmentTickets/admin"}]`)
	waitVolume(t, "e2e-v1", time.Minute, "detached after the ticket went", isDetached)

	// Attached again elsewhere, the data is there.
	useOn(t, "e2e-v1", "node-3", "read -P 0x5a 0 4M")
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

// Seed story 1: ticket changes racing each other never leave the volume
// where the controllers cannot bring it back, and the volume ends where the
// ticket rules say.
//
// Each round pins the volume on a node with a strata-api ticket, "hold".
// Then five goroutines change their own tickets at once (add, move to
// another node or type, remove; 100 changes over the rounds) while the
// pinned volume must stay where it is; the attachment must end with each
// goroutine's last write. Then the hold goes, and the volume must end on the
// hold's node if a remaining ticket keeps it there, else on the node of the
// ticket the selection rules pick from a detached volume (highest priority,
// then the smallest ticket ID), else detached.
//
// The racers' choices are seeded, so each round's last tickets are known
// whatever the interleaving; in even rounds they avoid the hold's node, so
// the volume must choose again. With this seed the rounds cover a tie of
// the highest priority decided by ID (twice), a ticket that keeps the
// volume, priority beating a smaller ID, and a snapshot ticket yielding to
// a workload ticket elsewhere.
func TestTicketRacesAlwaysResolve(t *testing.T) {
	// Not parallel: its racers' conflict retries are sized for the
	// controllers' own writes, not for the whole suite's load beside them.
	const vol, rounds, racers, changes = "e2e-race", 4, 5, 5 // 4 x 5 x 5 = 100 changes
	const seed = 25
	createVolume(t, vol, "16Mi", 2)
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	types := []v1beta1.AttacherType{v1beta1.AttacherTypeStrataAPI, v1beta1.AttacherTypeSnapshotController,
		v1beta1.AttacherTypeVolumeRestoreController}
	for round := 0; round < rounds; round++ {
		hold := nodeNames[round%len(nodeNames)]
		updateTickets(t, vol, func(m map[string]*v1beta1.AttachmentTicket) {
			clear(m)
			addTicket("hold", v1beta1.AttacherTypeStrataAPI, hold)(m)
		})
		waitTicketsJudged(t, vol, "hold")
		waitVolume(t, vol, 2*time.Minute, fmt.Sprintf("round %d: pinned on %s", round, hold), attachedTo(hold))

		// Each racer owns one ticket ID: "csi" (the one CSI ticket a volume
		// that is not migratable may have) or t1..t4, whose type changes.
		final := make([]*v1beta1.AttachmentTicket, racers)
		errs := make(chan error, racers)
		var wg sync.WaitGroup
		for g := 0; g < racers; g++ {
			wg.Go(func() {
				rng := rand.New(rand.NewSource(seed*100 + int64(round*racers+g)))
				choices := nodeNames
				if round%2 == 0 {
					choices = slices.DeleteFunc(slices.Clone(nodeNames), func(n string) bool { return n == hold })
				}
				id := fmt.Sprintf("t%d", g)
				if g == 0 {
					id = "csi"
				}
				var last *v1beta1.AttachmentTicket
				for c := 0; c < changes; c++ {
					last = nil
					if rng.Intn(4) > 0 {
						typ := v1beta1.AttacherTypeCSIAttacher
						if g > 0 {
							typ = types[rng.Intn(len(types))]
						}
						last = &v1beta1.AttachmentTicket{ID: id, Type: typ, NodeID: choices[rng.Intn(len(choices))],
							Parameters: map[string]string{}}
					}
					if err := setTicket(vol, id, last); err != nil {
						errs <- fmt.Errorf("racer %d, change %d: %w", g, c, err)
						return
					}
				}
				final[g] = last
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		want := map[string]*v1beta1.AttachmentTicket{}
		for _, tk := range final {
			if tk != nil {
				want[tk.ID] = tk
			}
		}
		got := getVA(t, vol).Spec.AttachmentTickets
		require.Contains(t, got, "hold")
		for id, tk := range got {
			if id == "hold" {
				continue
			}
			if assert.Contains(t, want, id, "round %d: ticket %s survived its racer's removal", round, id) {
				assert.Equal(t, []string{string(want[id].Type), want[id].NodeID}, []string{string(tk.Type), tk.NodeID},
					"round %d: ticket %s is its racer's last write", round, id)
			}
		}
		assert.Len(t, got, len(want)+1, "round %d: every racer's last write is there", round)
		v := getVolume(t, vol)
		require.Equal(t, hold, v.Spec.NodeID, "round %d: the hold kept the volume on %s", round, hold)

		// The hold goes: where must the volume end?
		expect, why := ruleNode(want, hold)
		t.Logf("round %d: tickets %s; expect %q: %s", round, describeTickets(want), expect, why)
		updateTickets(t, vol, removeTicket("hold"))
		v = waitSettled(t, vol, "hold", len(want) > 0)
		assert.Equal(t, expect, v.Status.CurrentNodeID, "round %d: %s", round, why)
	}
	updateTickets(t, vol, func(m map[string]*v1beta1.AttachmentTicket) { clear(m) })
	waitVolume(t, vol, 2*time.Minute, "detached at the end", isDetached)
}

// setTicket writes one ticket (nil: removes it), retrying on conflicts only
// (racers and controllers write the same object): safe from any goroutine.
func setTicket(volume, id string, tk *v1beta1.AttachmentTicket) error {
	ctx := context.Background()
	vas := env.adminStrata.StrataV1beta1().VolumeAttachments(ns)
	backoff := wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 30, Cap: time.Second}
	return retry.RetryOnConflict(backoff, func() error {
		va, err := vas.Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if va.Spec.AttachmentTickets == nil {
			va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
		}
		if tk == nil {
			delete(va.Spec.AttachmentTickets, id)
		} else {
			va.Spec.AttachmentTickets[id] = tk.DeepCopy()
		}
		_, err = vas.Update(ctx, va, metav1.UpdateOptions{})
		return err
	})
}

// The ticket rules as the volume-attachment proposal states them, written
// out again here so that a controller that strays from them fails.
var ticketRank = map[v1beta1.AttacherType]int{
	v1beta1.AttacherTypeVolumeRestoreController: v1beta1.AttacherPriorityLevelVolumeRestoreController,
	v1beta1.AttacherTypeStrataAPI:               v1beta1.AttacherPriorityLevelStrataAPI,
	v1beta1.AttacherTypeCSIAttacher:             v1beta1.AttacherPriorityLevelCSIAttacher,
	v1beta1.AttacherTypeSnapshotController:      v1beta1.AttacherPriorityLevelSnapshotController,
}

// ruleNode is where a volume attached to node, whose tickets become
// tickets, ends: it stays while a ticket keeps it there (one that is not
// interruptible, or an interruptible one with no workload ticket on another
// node); else it detaches and attaches for the best ticket, highest priority
// first, then the smallest ID; with no ticket it stays detached.
func ruleNode(tickets map[string]*v1beta1.AttachmentTicket, node string) (string, string) {
	here, interruptibleOnly, workloadElsewhere := false, true, false
	for _, tk := range tickets {
		switch {
		case tk.NodeID == node:
			here = true
			interruptibleOnly = interruptibleOnly && tk.Type == v1beta1.AttacherTypeSnapshotController
		case tk.Type == v1beta1.AttacherTypeCSIAttacher || tk.Type == v1beta1.AttacherTypeStrataAPI:
			workloadElsewhere = true
		}
	}
	if here && !(interruptibleOnly && workloadElsewhere) {
		return node, "a ticket keeps it on " + node
	}
	var best *v1beta1.AttachmentTicket
	for _, tk := range tickets {
		if best == nil || ticketRank[tk.Type] > ticketRank[best.Type] ||
			(ticketRank[tk.Type] == ticketRank[best.Type] && tk.ID < best.ID) {
			best = tk
		}
	}
	if best == nil {
		return "", "no ticket left"
	}
	return best.NodeID, fmt.Sprintf("detached from %s, attached for the best ticket %s (%s) on %s",
		node, best.ID, best.Type, best.NodeID)
}

func describeTickets(tickets map[string]*v1beta1.AttachmentTicket) string {
	var out []string
	for id, tk := range tickets {
		out = append(out, fmt.Sprintf("%s=%s@%s", id, tk.Type, tk.NodeID))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// waitTicketsJudged waits until the AD controller has judged the tickets
// as they are now: their statuses are written in the sync that decides on
// the volume, after the decision.
func waitTicketsJudged(t *testing.T, volume string, want ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		va := getVA(t, volume)
		if len(va.Status.AttachmentTicketStatuses) != len(va.Spec.AttachmentTickets) {
			return false
		}
		for id, tk := range va.Spec.AttachmentTickets {
			st := va.Status.AttachmentTicketStatuses[id]
			if st == nil || st.Generation != tk.Generation {
				return false
			}
		}
		for _, id := range want {
			if va.Spec.AttachmentTickets[id] == nil {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the tickets of %s judged", volume)
}

// waitSettled waits until the AD controller has seen ticket gone's removal
// and the volume has come to rest: attached where its spec says (attached
// true) or detached and asked nowhere.
func waitSettled(t *testing.T, volume, gone string, attached bool) *v1beta1.Volume {
	t.Helper()
	require.Eventually(t, func() bool {
		_, ok := getVA(t, volume).Status.AttachmentTicketStatuses[gone]
		return !ok
	}, time.Minute, 100*time.Millisecond, "the removal of ticket %s judged", gone)
	return waitVolume(t, volume, 2*time.Minute, "at rest", func(v *v1beta1.Volume) bool {
		if attached {
			return v.Status.State == v1beta1.VolumeStateAttached && v.Spec.NodeID == v.Status.CurrentNodeID
		}
		return isDetached(v) && v.Spec.NodeID == ""
	})
}

// Killing the instance manager that holds one replica while data is being
// written: the volume goes degraded, a new replica replaces the lost one and
// is rebuilt, the volume is healthy again, and every byte reads back. Reads
// through the engine may come from any replica, so the rebuilt replica's
// own files are read once the volume is detached: it must hold every write,
// those from before the loss, those during it and those after the rebuild.
func TestReplicaLossIsRebuilt(t *testing.T) {
	defer setSetting(t, stypes.SettingReplicaReplenishmentWaitInterval, "1")()
	createVolume(t, "e2e-rebuild", "64Mi", 3)
	waitVolume(t, "e2e-rebuild", time.Minute, "detached", isDetached)
	updateTickets(t, "e2e-rebuild", addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, "e2e-rebuild", time.Minute, "attached to node-1", attachedTo("node-1"))
	ep := v.Status.FrontendEndpoint
	qemuIO(t, ep, "write -P 0x11 0 16M")

	victim := ""
	before := map[string]bool{}
	for _, r := range replicasOf(t, "e2e-rebuild") {
		before[r.Name] = true
		if victim == "" && r.Spec.NodeID != "node-1" {
			victim = r.Spec.NodeID
		}
	}
	require.NotEmpty(t, victim)
	mgr := env.managers[victim]
	// Writes go on while the replica is lost: half before the kill, half
	// after it, ordered by the kill itself rather than by sleeps.
	halfway, killed, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; i < 8; i++ {
			if i == 4 {
				close(halfway)
				<-killed
			}
			if _, err := runQemuIO(ep, fmt.Sprintf("write -P 0x22 %dM 2M", 16+2*i)); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case <-halfway:
	case err := <-done:
		require.NoError(t, err, "writes before the loss")
	}
	require.NoError(t, mgr.IM.Kill())
	close(killed)
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
	// The lost replica is rebuilt: either the same one, reused once its
	// instance manager is back within the replenishment wait, or a new one
	// in its place after it.
	var rebuilt []v1beta1.Replica
	live := 0
	for _, r := range replicasOf(t, "e2e-rebuild") {
		if r.DeletionTimestamp == nil && r.Spec.FailedAt == "" {
			live++
			if !before[r.Name] || r.Spec.NodeID == victim {
				rebuilt = append(rebuilt, r)
			}
		}
	}
	assert.Equal(t, 3, live, "three healthy replicas")
	require.Len(t, rebuilt, 1, "one replica, new or reused, took the lost one's place")
	t.Logf("the lost replica's place: %s on %s (reused: %v)", rebuilt[0].Name, rebuilt[0].Spec.NodeID, before[rebuilt[0].Name])
	assert.NotEmpty(t, rebuilt[0].Spec.HealthyAt, "the engine reported the rebuilt replica RW")
	qemuIO(t, ep, "read -P 0x11 0 16M", "read -P 0x22 16M 16M")
	// A write once the new replica is RW reaches it too.
	qemuIO(t, ep, "write -P 0x33 32M 4M")

	updateTickets(t, "e2e-rebuild", removeTicket("admin"))
	waitVolume(t, "e2e-rebuild", time.Minute, "detached", isDetached)
	r := rebuilt[0]
	require.Eventually(t, func() bool {
		for _, cur := range replicasOf(t, "e2e-rebuild") {
			if cur.Name == r.Name {
				return cur.Status.CurrentState == v1beta1.InstanceStateStopped
			}
		}
		return false
	}, time.Minute, 100*time.Millisecond, "replica %s stopped: its files are quiet", r.Name)
	disk := r.Spec.DiskPath
	if disk == "" {
		disk = env.managers[r.Spec.NodeID].DiskDir
	}
	assertReplicaHolds(t, filepath.Join(disk, "replicas", r.Spec.DataDirectoryName), []patternRange{
		{0x11, 0, 16 << 20}, {0x22, 16 << 20, 16 << 20}, {0x33, 32 << 20, 4 << 20}, {0, 36 << 20, 28 << 20}})
}

// patternRange is length bytes at off, each equal to b.
type patternRange struct {
	b           byte
	off, length int64
}

// assertReplicaHolds opens a stopped replica's directory, as its instance
// manager would, and checks its data, 1 MiB at a time.
func assertReplicaHolds(t *testing.T, dir string, want []patternRange) {
	t.Helper()
	rep, err := replica.Open(dir)
	require.NoError(t, err, "open the replica in %s", dir)
	defer rep.Close()
	buf := make([]byte, 1<<20)
	for _, w := range want {
		for off := w.off; off < w.off+w.length; off += int64(len(buf)) {
			p := buf[:min(int64(len(buf)), w.off+w.length-off)]
			_, err := rep.ReadAt(p, off)
			require.NoError(t, err)
			for i, got := range p {
				if got != w.b {
					require.Failf(t, "replica data differs", "%s: byte %d is %#x, want %#x", dir, off+int64(i), got, w.b)
				}
			}
		}
	}
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
	var upgradeID string
	for id, tk := range getVA(t, "e2e-upg").Spec.AttachmentTickets {
		assert.Equal(t, "node-3", tk.NodeID)
		upgradeID = id
	}
	// The AD controller writes a ticket's status in the sync that decides on
	// the volume, after that decision: once the new ticket's status is
	// there, a detach would already be in the volume's spec.
	require.Eventually(t, func() bool {
		return getVA(t, "e2e-upg").Status.AttachmentTicketStatuses[upgradeID] != nil
	}, 30*time.Second, 100*time.Millisecond, "the AD controller judged the new VolumeAttachment")
	v := getVolume(t, "e2e-upg")
	assert.Equal(t, "node-3", v.Spec.NodeID, "the volume is not being detached")
	assert.True(t, attachedTo("node-3")(v), "the volume stayed attached")
	assert.True(t, getVA(t, "e2e-upg").Status.AttachmentTicketStatuses[upgradeID].Satisfied, "the upgrade ticket is satisfied")

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
	useOn(t, "e2e-grow", "node-1", "write -P 0x44 0 16M")

	require.NoError(t, retryOnConflict(func() error {
		v := getVolume(t, "e2e-grow")
		v.Spec.Size = resource.MustParse("48Mi")
		_, err := env.adminStrata.StrataV1beta1().Volumes(ns).Update(ctx, v, metav1.UpdateOptions{})
		return err
	}))
	waitVolume(t, "e2e-grow", time.Minute, "expanded while detached", func(v *v1beta1.Volume) bool {
		return isDetached(v) && v.Status.CurrentSize == 48<<20
	})
	useOn(t, "e2e-grow", "node-2", "read -P 0x44 0 16M", "write -P 0x55 40M 8M", "read -P 0x55 40M 8M")
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
		dir := replicaDataDir(r)
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

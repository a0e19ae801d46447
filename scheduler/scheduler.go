// Package scheduler decides where a new replica of a volume goes.
//
// It is a pure function of its inputs (the volume, its replicas, every Node CR
// and a few settings), with no client or informer, so the volume controller
// can call it from its reconcile loop and the rules can be table-tested.
//
// The rules follow Longhorn's replica scheduler, simplified:
//
//   - A node is a candidate when its manager is alive (holds its heartbeat),
//     its Ready condition is True, spec.allowScheduling is set and its
//     instance manager is running.
//   - A disk is a candidate when spec.allowScheduling is set, its status has a
//     DiskUUID, its Schedulable condition (if any) is True, it holds no replica
//     of the volume (failed ones included), and the volume fits: the scheduled
//     sizes plus the volume's size stay within the over-provisioning
//     percentage of the disk's usable space (maximum minus reserved), and the
//     free space left after the reserved space and the volume's actual data
//     is at least the minimal-available percentage of the disk.
//   - Hard anti-affinity: a node holding a replica of the volume that has not
//     failed is not a candidate. With soft anti-affinity such a node is still
//     a candidate, but only after every node holding fewer replicas.
//   - Among candidates: fewest replicas of the volume on the node first, then
//     the disk with the most schedulable space left, then node and disk names.
package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Options are the settings and cluster facts the decision depends on.
type Options struct {
	// SoftAntiAffinity is the replica-soft-anti-affinity setting: when no node
	// free of the volume's replicas fits, a node already holding one may take
	// another (on a different disk).
	SoftAntiAffinity bool
	// OverProvisioningPercentage is the storage-over-provisioning-percentage
	// setting: replicas may be scheduled on a disk up to this percent of its
	// usable size (100 = the usable size).
	OverProvisioningPercentage int64
	// MinimalAvailablePercentage is the storage-minimal-available-percentage
	// setting: a disk whose free space would drop below this percent of its
	// size takes no new replica.
	MinimalAvailablePercentage int64
	// AliveNodes holds the nodes whose managers hold their heartbeat.
	AliveNodes map[string]bool
	// ScheduledBytes is, per disk UUID, the sum of the sizes of the replicas
	// placed there as the caller's cache knows them now. A disk's status
	// reports the same only at its next check, so a burst of new volumes
	// would otherwise all see the same free space and pile onto one node.
	// The larger of the two counts.
	ScheduledBytes map[string]int64
	// InstanceManagerDown says, per node, why its data plane cannot run a
	// replica now (its InstanceManager is not running). A replica placed
	// there would never start, and the volume would stay degraded.
	InstanceManagerDown map[string]string
	// OnlyNode, when set, is the one node the replica may go to (a volume's
	// data locality asks for a replica where it is attached); the other
	// nodes are not considered.
	OnlyNode string
}

// Placement is where the new replica goes.
type Placement struct {
	NodeID   string
	DiskName string
	DiskUUID string
	DiskPath string
}

// Rejection says why a node, or one disk of it, cannot take the replica.
type Rejection struct {
	Node string
	// Disk is empty when the whole node was rejected.
	Disk   string
	Reason string
}

func (r Rejection) String() string {
	if r.Disk == "" {
		return r.Node + ": " + r.Reason
	}
	return r.Node + "/" + r.Disk + ": " + r.Reason
}

// NoPlacementError is returned when no node and disk can take the replica.
// Its message lists every rejected node or disk with the reason, for the
// volume's Scheduled=False condition.
type NoPlacementError struct {
	Volume     string
	Rejections []Rejection
}

func (e *NoPlacementError) Error() string {
	if len(e.Rejections) == 0 {
		return "no node can take a new replica: there are no nodes"
	}
	parts := make([]string, len(e.Rejections))
	for i, r := range e.Rejections {
		parts[i] = r.String()
	}
	return "no node can take a new replica: " + strings.Join(parts, "; ")
}

// IsNoPlacement reports whether err is (or wraps) a *NoPlacementError.
func IsNoPlacement(err error) bool {
	var npe *NoPlacementError
	return errors.As(err, &npe)
}

type candidate struct {
	placement Placement
	// held is how many replicas of the volume that have not failed are on the node.
	held int
	// left is the schedulable space the disk keeps after taking the replica.
	left int64
}

// ScheduleReplica picks a node and disk for one new replica of vol. replicas
// are the volume's existing replicas, failed ones included (spec.failedAt set);
// replicas not yet placed (no spec.nodeID) and replicas of other volumes are
// ignored. nodes is every Node CR. When nothing fits the error is a
// *NoPlacementError.
func ScheduleReplica(vol *v1beta1.Volume, replicas []*v1beta1.Replica, nodes []*v1beta1.Node, opts Options) (Placement, error) {
	if vol == nil {
		return Placement{}, errors.New("scheduler: nil volume")
	}
	size := vol.Spec.Size.Value()
	if size <= 0 {
		return Placement{}, fmt.Errorf("scheduler: volume %s has size %d, want more than 0", vol.Name, size)
	}

	// Who holds what, sorted by replica name so messages are stable.
	placed := make([]*v1beta1.Replica, 0, len(replicas))
	for _, r := range replicas {
		if r == nil || r.Spec.NodeID == "" || (r.Spec.VolumeName != "" && r.Spec.VolumeName != vol.Name) {
			continue
		}
		placed = append(placed, r)
	}
	slices.SortFunc(placed, func(a, b *v1beta1.Replica) int { return cmp.Compare(a.Name, b.Name) })
	liveOnNode := map[string][]string{}
	for _, r := range placed {
		if r.Spec.FailedAt == "" {
			liveOnNode[r.Spec.NodeID] = append(liveOnNode[r.Spec.NodeID], r.Name)
		}
	}

	sorted := make([]*v1beta1.Node, 0, len(nodes))
	for _, n := range nodes {
		if n != nil {
			sorted = append(sorted, n)
		}
	}
	slices.SortFunc(sorted, func(a, b *v1beta1.Node) int { return cmp.Compare(a.Name, b.Name) })

	var cands []candidate
	var rejections []Rejection
	for _, node := range sorted {
		if opts.OnlyNode != "" && node.Name != opts.OnlyNode {
			continue
		}
		if reason := nodeRejection(node, opts); reason != "" {
			rejections = append(rejections, Rejection{Node: node.Name, Reason: reason})
			continue
		}
		held := liveOnNode[node.Name]
		if len(held) > 0 && !opts.SoftAntiAffinity {
			rejections = append(rejections, Rejection{Node: node.Name, Reason: fmt.Sprintf(
				"already holds replica %s (%s is off)", strings.Join(held, ", "), types.SettingReplicaSoftAntiAffinity)})
			continue
		}
		if len(node.Spec.Disks) == 0 {
			rejections = append(rejections, Rejection{Node: node.Name, Reason: "has no disks"})
			continue
		}
		diskNames := make([]string, 0, len(node.Spec.Disks))
		for name := range node.Spec.Disks {
			diskNames = append(diskNames, name)
		}
		slices.Sort(diskNames)
		for _, name := range diskNames {
			spec := node.Spec.Disks[name]
			st := node.Status.DiskStatus[name]
			left, reason := diskFit(vol, size, node.Name, spec, st, placed, opts)
			if reason != "" {
				rejections = append(rejections, Rejection{Node: node.Name, Disk: name, Reason: reason})
				continue
			}
			cands = append(cands, candidate{
				placement: Placement{NodeID: node.Name, DiskName: name, DiskUUID: st.DiskUUID, DiskPath: spec.Path},
				held:      len(held),
				left:      left,
			})
		}
	}

	if len(cands) == 0 {
		return Placement{}, &NoPlacementError{Volume: vol.Name, Rejections: rejections}
	}
	best := slices.MinFunc(cands, func(a, b candidate) int {
		return cmp.Or(
			cmp.Compare(a.held, b.held),
			cmp.Compare(b.left, a.left), // more space left first
			cmp.Compare(a.placement.NodeID, b.placement.NodeID),
			cmp.Compare(a.placement.DiskName, b.placement.DiskName),
		)
	})
	return best.placement, nil
}

// nodeRejection says why a node cannot take any replica, or "" if it can.
func nodeRejection(node *v1beta1.Node, opts Options) string {
	if !opts.AliveNodes[node.Name] {
		return "down (its manager holds no heartbeat)"
	}
	ready := meta.FindStatusCondition(node.Status.Conditions, v1beta1.ConditionTypeReady)
	switch {
	case ready == nil:
		return "not ready (no Ready condition yet)"
	case ready.Status != metav1.ConditionTrue:
		if ready.Reason != "" {
			return "not ready (" + ready.Reason + ")"
		}
		return "not ready"
	}
	if !node.Spec.AllowScheduling {
		return "scheduling is disabled on the node"
	}
	if why, down := opts.InstanceManagerDown[node.Name]; down {
		return why
	}
	return ""
}

// DiskSchedulable is the largest replica of a new, empty volume the disk
// takes now, by the rules ScheduleReplica applies (0 when it takes none):
// what the CSI driver reports as capacity.
func DiskSchedulable(nodeName string, spec v1beta1.DiskSpec, st *v1beta1.DiskStatus, opts Options) int64 {
	room, why := diskFit(&v1beta1.Volume{}, 0, nodeName, spec, st, nil, opts)
	if why != "" {
		return 0
	}
	return room
}

// diskFit checks one disk of a candidate node. It returns the schedulable
// space the disk keeps after taking the replica, or why it cannot take it.
func diskFit(vol *v1beta1.Volume, size int64, nodeName string, spec v1beta1.DiskSpec, st *v1beta1.DiskStatus,
	placed []*v1beta1.Replica, opts Options) (int64, string) {
	// Never the same disk twice for one volume, failed replicas included:
	// their data directory is still there.
	var onDisk []string
	for _, r := range placed {
		sameUUID := st != nil && st.DiskUUID != "" && r.Spec.DiskID == st.DiskUUID
		samePath := r.Spec.DiskID == "" && r.Spec.NodeID == nodeName && r.Spec.DiskPath == spec.Path
		if sameUUID || samePath {
			onDisk = append(onDisk, r.Name)
		}
	}
	if len(onDisk) > 0 {
		return 0, "already holds replica " + strings.Join(onDisk, ", ")
	}
	if !spec.AllowScheduling {
		return 0, "scheduling is disabled on the disk"
	}
	if st == nil || st.DiskUUID == "" {
		return 0, "not detected yet (no disk UUID)"
	}
	if c := meta.FindStatusCondition(st.Conditions, v1beta1.ConditionTypeSchedulable); c != nil && c.Status != metav1.ConditionTrue {
		msg := c.Message
		if msg == "" {
			msg = c.Reason
		}
		return 0, "not schedulable: " + msg
	}
	if st.StorageMaximum <= 0 {
		return 0, "size unknown (storageMaximum is 0)"
	}

	reserved := spec.StorageReserved.Value()
	usable := max(st.StorageMaximum-reserved, 0)
	scheduled := max(st.StorageScheduled, opts.ScheduledBytes[st.DiskUUID])
	schedulable := max(percentFloor(usable, opts.OverProvisioningPercentage)-scheduled, 0)
	if size > schedulable {
		return 0, fmt.Sprintf("needs %d bytes, %d schedulable (%d%% of %d usable, %d already scheduled; %s)",
			size, schedulable, opts.OverProvisioningPercentage, usable, scheduled,
			types.SettingStorageOverProvisioningPercentage)
	}

	// The rebuild writes the volume's actual data; what is left must still
	// meet the minimal-available percentage. With no data yet this is the
	// node controller's own Schedulable rule.
	free := st.StorageAvailable - reserved
	after := free - max(vol.Status.ActualSize, 0)
	if free <= 0 || after < 0 || after < percentCeil(st.StorageMaximum, opts.MinimalAvailablePercentage) {
		return 0, fmt.Sprintf("%d bytes free after %d reserved and %d of data, below %d%% of %d (%s)",
			max(after, 0), reserved, max(vol.Status.ActualSize, 0), opts.MinimalAvailablePercentage,
			st.StorageMaximum, types.SettingStorageMinimalAvailablePercentage)
	}
	return schedulable - size, ""
}

// percentFloor is floor(v*pct/100) for v >= 0, without overflowing on v*pct.
func percentFloor(v, pct int64) int64 {
	if v <= 0 || pct <= 0 {
		return 0
	}
	return v/100*pct + v%100*pct/100
}

// percentCeil is ceil(v*pct/100) for v >= 0, without overflowing on v*pct.
func percentCeil(v, pct int64) int64 {
	if v <= 0 || pct <= 0 {
		return 0
	}
	return v/100*pct + (v%100*pct+99)/100
}

package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Event reasons of the node controller.
const (
	EventReasonNodeRegistered = "Registered"
	EventReasonNodeReady      = "ManagerRunning"
	EventReasonNodeDown       = "ManagerDown"
	EventReasonDiskNotReady   = "DiskNotReady"
)

func (nc *NodeController) syncNode(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	node, err := nc.DS.Nodes.GetRO(name)
	if apierrors.IsNotFound(err) {
		if name == nc.ControllerID {
			return nc.registerNode(ctx)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if name == nc.ControllerID {
		return nc.syncOwnNode(ctx, node)
	}
	return nc.syncPeerNode(ctx, key, node)
}

// registerNode creates this manager's Node CR with the disks it was started
// with. Later starts leave the CR's disks to the admin.
func (nc *NodeController) registerNode(ctx context.Context) error {
	node := &v1beta1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:      nc.ControllerID,
			Namespace: nc.DS.Namespace,
			Labels:    map[string]string{types.LabelNode: nc.ControllerID},
		},
		Spec: v1beta1.NodeSpec{AllowScheduling: true, Disks: map[string]v1beta1.DiskSpec{}},
	}
	for _, d := range nc.disks {
		node.Spec.Disks[d.Name] = v1beta1.DiskSpec{Path: d.Path, AllowScheduling: true}
	}
	created, err := nc.DS.Nodes.Create(ctx, node)
	if apierrors.IsAlreadyExists(err) {
		return nil // the cache has not caught up; the add event syncs it
	}
	if err != nil {
		return fmt.Errorf("registering node %s: %w", nc.ControllerID, err)
	}
	nc.Logger.WithField("disks", len(node.Spec.Disks)).Info("Registered node")
	nc.Recorder.Eventf(created, corev1.EventTypeNormal, EventReasonNodeRegistered,
		"Registered node with %d disk(s)", len(node.Spec.Disks))
	return nil
}

// syncOwnNode reports this node Ready and its disks as they are now.
func (nc *NodeController) syncOwnNode(ctx context.Context, nodeRO *v1beta1.Node) error {
	node := nodeRO.DeepCopy()
	now := metav1.NewTime(nc.DS.Clock.Now())

	minAvailablePct, err := nc.DS.GetSettingInt(types.SettingStorageMinimalAvailablePercentage)
	if err != nil {
		return err
	}
	node.Status.DiskStatus = nc.diskStatuses(node, minAvailablePct, now)
	node.Status.DiskPaths = diskPaths(node)
	node.Status.APIAddress = nc.apiAddress

	// Claim Ready only once the cache holds a live heartbeat lease: peers
	// judge the node by that lease, and claiming Ready before it is renewed
	// after a restart would have them mark the node down again. The lease's
	// add or renewal event syncs the node once it is live.
	wasReady := meta.IsStatusConditionTrue(nodeRO.Status.Conditions, v1beta1.ConditionTypeReady)
	if nc.DS.IsNodeAlive(nc.ControllerID) {
		meta.SetStatusCondition(&node.Status.Conditions, metav1.Condition{
			Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionTrue, LastTransitionTime: now,
			Reason: v1beta1.NodeConditionReasonManagerRunning, Message: "strata-manager is running on the node",
		})
	}
	meta.SetStatusCondition(&node.Status.Conditions, nodeSchedulableCondition(node, now))

	if equality.Semantic.DeepEqual(nodeRO.Status, node.Status) {
		return nc.cleanupOrphans(ctx, node)
	}
	updated, err := nc.DS.Nodes.UpdateStatus(ctx, node)
	if err != nil {
		return err
	}
	if err := nc.cleanupOrphans(ctx, updated); err != nil {
		return err
	}
	if !wasReady && meta.IsStatusConditionTrue(updated.Status.Conditions, v1beta1.ConditionTypeReady) {
		nc.Recorder.Event(updated, corev1.EventTypeNormal, EventReasonNodeReady, "strata-manager is running on the node")
	}
	for name, ds := range updated.Status.DiskStatus {
		before := nodeRO.Status.DiskStatus[name]
		c := meta.FindStatusCondition(ds.Conditions, v1beta1.ConditionTypeReady)
		if c != nil && c.Status == metav1.ConditionFalse &&
			(before == nil || meta.IsStatusConditionTrue(before.Conditions, v1beta1.ConditionTypeReady) ||
				meta.FindStatusCondition(before.Conditions, v1beta1.ConditionTypeReady) == nil) {
			nc.Recorder.Eventf(updated, corev1.EventTypeWarning, EventReasonDiskNotReady, "Disk %s: %s", name, c.Message)
		}
	}
	return nil
}

// diskStatuses inspects every disk in the spec and reports identity, space,
// the replicas placed on it, and whether it can take more.
func (nc *NodeController) diskStatuses(node *v1beta1.Node, minAvailablePct int64, now metav1.Time) map[string]*v1beta1.DiskStatus {
	out := make(map[string]*v1beta1.DiskStatus, len(node.Spec.Disks))
	infos, errs := inspectDisks(node)
	// Where each UUID is found now: a disk remounted at another path and
	// added under that path is the same disk (its replicas and backing
	// image copies are still on it), so its UUID moves to the new entry.
	foundAt := map[string]string{}
	for name, info := range infos {
		foundAt[info.UUID] = name
	}
	for _, name := range slices.Sorted(maps.Keys(node.Spec.Disks)) {
		spec := node.Spec.Disks[name]
		st := &v1beta1.DiskStatus{}
		if prev := node.Status.DiskStatus[name]; prev != nil {
			st = prev.DeepCopy()
		}
		err := errs[name]
		if moved, ok := foundAt[st.DiskUUID]; ok && err != nil && moved != name {
			// The UUID stays, so the entry keeps saying where the disk went;
			// lookups by UUID take the ready entry (datastore.NodeDisks).
			err = &diskError{v1beta1.DiskConditionReasonMigrated, fmt.Errorf("disk %s (UUID %s) is now at %s, disk %s; this path is no longer used",
				name, st.DiskUUID, node.Spec.Disks[moved].Path, moved)}
		}
		if err != nil {
			reason := v1beta1.DiskConditionReasonPathMissing
			var de *diskError
			if errors.As(err, &de) {
				reason = de.reason
			}
			st.StorageMaximum, st.StorageAvailable = 0, 0
			st.OrphanedReplicaDirectories = nil // unknown while the disk is not readable
			kit.SetCondition(&st.Conditions, v1beta1.ConditionTypeReady, false, reason, err.Error(), now)
			kit.SetCondition(&st.Conditions, v1beta1.ConditionTypeSchedulable, false, reason, "disk is not ready", now)
			out[name] = st
			continue
		}
		info := infos[name]
		st.DiskUUID = info.UUID
		st.StorageMaximum = info.Total
		st.StorageAvailable = stableAvailable(st.StorageAvailable, info.Available, info.Total)
		st.ScheduledReplica, st.StorageScheduled = nc.scheduledReplicas(node.Name, info.UUID)
		st.OrphanedReplicaDirectories = nc.orphanedDirectories(spec.Path)
		kit.SetCondition(&st.Conditions, v1beta1.ConditionTypeReady, true, v1beta1.DiskConditionReasonReady, "disk is ready", now)
		ok, reason, msg := diskSchedulable(node, spec, st, minAvailablePct)
		kit.SetCondition(&st.Conditions, v1beta1.ConditionTypeSchedulable, ok, reason, msg, now)
		out[name] = st
	}
	return out
}

// inspectDisks reads every disk of the node: what each says about itself,
// or why it cannot be read. Two readable disks with one UUID are one
// directory reached twice: the second (by name) is refused.
func inspectDisks(node *v1beta1.Node) (map[string]diskInfo, map[string]error) {
	infos, errs := map[string]diskInfo{}, map[string]error{}
	seenUUID := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(node.Spec.Disks)) {
		known := ""
		if st := node.Status.DiskStatus[name]; st != nil {
			known = st.DiskUUID
		}
		info, err := inspectDisk(node.Spec.Disks[name].Path, known)
		if err == nil {
			if other, dup := seenUUID[info.UUID]; dup {
				err = &diskError{v1beta1.DiskConditionReasonUUIDError,
					fmt.Errorf("disk %s has the same UUID %s as disk %s: two disks on one filesystem directory", name, info.UUID, other)}
			} else {
				seenUUID[info.UUID] = name
			}
		}
		if err != nil {
			errs[name] = err
			continue
		}
		infos[name] = info
	}
	return infos, errs
}

// scheduledReplicas finds the replicas placed on a disk through the by-disk index.
func (nc *NodeController) scheduledReplicas(nodeName, diskUUID string) (map[string]int64, int64) {
	replicas, err := nc.DS.Replicas.ListByIndexRO(datastore.IndexByDisk, diskUUID)
	if err != nil || len(replicas) == 0 {
		return nil, 0
	}
	sizes := map[string]int64{}
	var total int64
	for _, r := range replicas {
		if r.Spec.NodeID != nodeName {
			continue
		}
		sizes[r.Name] = r.Spec.VolumeSize
		total += r.Spec.VolumeSize
	}
	if len(sizes) == 0 {
		return nil, 0
	}
	return sizes, total
}

func diskSchedulable(node *v1beta1.Node, spec v1beta1.DiskSpec, st *v1beta1.DiskStatus, minAvailablePct int64) (bool, string, string) {
	switch {
	case !node.Spec.AllowScheduling:
		return false, v1beta1.DiskConditionReasonSchedOff, "scheduling is disabled on the node"
	case !spec.AllowScheduling:
		return false, v1beta1.DiskConditionReasonSchedOff, "scheduling is disabled on the disk"
	}
	usable := st.StorageAvailable - spec.StorageReserved.Value()
	if usable <= 0 || usable*100 < st.StorageMaximum*minAvailablePct {
		return false, v1beta1.DiskConditionReasonFull, fmt.Sprintf(
			"%d bytes free after the %d reserved, less than %d%% of %d (setting %s)",
			max(usable, 0), spec.StorageReserved.Value(), minAvailablePct, st.StorageMaximum,
			types.SettingStorageMinimalAvailablePercentage)
	}
	return true, v1beta1.DiskConditionReasonSchedulable, "disk can take new replicas"
}

func nodeSchedulableCondition(node *v1beta1.Node, now metav1.Time) metav1.Condition {
	c := metav1.Condition{Type: v1beta1.ConditionTypeSchedulable, LastTransitionTime: now}
	switch {
	case !node.Spec.AllowScheduling:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1beta1.NodeConditionReasonSchedulingOff, "scheduling is disabled on the node"
	case !anyDiskSchedulable(node):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1beta1.NodeConditionReasonNoDisk, "no disk can take new replicas"
	default:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, v1beta1.NodeConditionReasonHasDisk, "a disk can take new replicas"
	}
	return c
}

func anyDiskSchedulable(node *v1beta1.Node) bool {
	for _, st := range node.Status.DiskStatus {
		if meta.IsStatusConditionTrue(st.Conditions, v1beta1.ConditionTypeSchedulable) {
			return true
		}
	}
	return false
}

// syncPeerNode watches another node's heartbeat. While it is alive the node
// is re-checked when its lease would run out; once it has run out, one alive
// manager marks the node not Ready. The node's own manager marks it Ready
// again when it comes back.
func (nc *NodeController) syncPeerNode(ctx context.Context, key string, nodeRO *v1beta1.Node) error {
	now := nc.DS.Clock.Now()
	deadline, hasLease := nc.DS.NodeLeaseExpiry(nodeRO.Name)
	if !hasLease {
		// A node registers before its first lease exists: give it one lease
		// duration from registration before the missing lease counts.
		deadline = nodeRO.CreationTimestamp.Add(nc.leaseDuration)
	}
	if now.Before(deadline) {
		nc.checkPeerAt(key, nodeRO.Name, deadline.Sub(now)+leaseCheckSlack)
		return nil
	}
	ready := meta.FindStatusCondition(nodeRO.Status.Conditions, v1beta1.ConditionTypeReady)
	if ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == v1beta1.NodeConditionReasonManagerDown {
		return nil
	}
	responsible, err := nc.IsResponsibleFor(key, nodeRO.Name, "")
	if err != nil {
		return err
	}
	if !responsible {
		// Look again later in case the responsible manager goes down too.
		nc.Queue.AddAfter(key, nc.leaseDuration)
		return nil
	}

	msg := "strata-manager has no heartbeat lease"
	if hasLease {
		msg = fmt.Sprintf("strata-manager heartbeat lease expired at %s", deadline.UTC().Format(time.RFC3339))
	}
	node := nodeRO.DeepCopy()
	t := metav1.NewTime(now)
	kit.SetCondition(&node.Status.Conditions, v1beta1.ConditionTypeReady, false, v1beta1.NodeConditionReasonManagerDown, msg, t)
	kit.SetCondition(&node.Status.Conditions, v1beta1.ConditionTypeSchedulable, false, v1beta1.NodeConditionReasonManagerDown, "node is down", t)
	updated, err := nc.DS.Nodes.UpdateStatus(ctx, node)
	if err != nil {
		return err
	}
	nc.Logger.WithField("node", node.Name).Warn("Marked node down: " + msg)
	nc.Recorder.Event(updated, corev1.EventTypeWarning, EventReasonNodeDown, msg)
	return nil
}

func diskPaths(node *v1beta1.Node) string {
	paths := make([]string, 0, len(node.Spec.Disks))
	for _, name := range slices.Sorted(maps.Keys(node.Spec.Disks)) {
		paths = append(paths, node.Spec.Disks[name].Path)
	}
	return strings.Join(paths, ",")
}

package attachment

// The decisions of the attach/detach (AD) controller, kept pure so they read
// as the volume-attachment proposal states them and are tested by table. The
// VolumeAttachmentController (volume_attachment_controller.go) applies them
// to Volume and VolumeAttachment CRs.

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Reasons of a ticket's Satisfied condition.
const (
	TicketReasonAttached          = "Attached"
	TicketReasonWaitingToAttach   = "WaitingForAttachment"
	TicketReasonOtherNodeWins     = "AttachedToAnotherNode"
	TicketReasonVolumeNotHealthy  = "VolumeNotAttachable"
	TicketReasonWaitingMigration  = "WaitingForMigration"
	TicketReasonWaitingForClone   = "WaitingForClone"
	TicketReasonWaitingForRestore = "WaitingForRestore"
	// TicketReasonBackingImageFailed: the volume's backing image failed or
	// is gone, so no replica can start; the message quotes the volume's
	// BackingImageReady condition (issue 23).
	TicketReasonBackingImageFailed = "BackingImageFailed"
)

var attacherPriorities = map[v1beta1.AttacherType]int{
	v1beta1.AttacherTypeVolumeRestoreController:          v1beta1.AttacherPriorityLevelVolumeRestoreController,
	v1beta1.AttacherTypeVolumeExpansionController:        v1beta1.AttacherPriorityLevelVolumeExpansionController,
	v1beta1.AttacherTypeStrataAPI:                        v1beta1.AttacherPriorityLevelStrataAPI,
	v1beta1.AttacherTypeCSIAttacher:                      v1beta1.AttacherPriorityLevelCSIAttacher,
	v1beta1.AttacherTypeSalvageController:                v1beta1.AttacherPriorityLevelSalvageController,
	v1beta1.AttacherTypeShareManagerController:           v1beta1.AttacherPriorityLevelShareManagerController,
	v1beta1.AttacherTypeSnapshotController:               v1beta1.AttacherPriorityLevelSnapshotController,
	v1beta1.AttacherTypeBackupController:                 v1beta1.AttacherPriorityLevelBackupController,
	v1beta1.AttacherTypeVolumeCloneController:            v1beta1.AttacherPriorityLevelVolumeCloneController,
	v1beta1.AttacherTypeVolumeEvictionController:         v1beta1.AttacherPriorityLevelVolumeEvictionController,
	v1beta1.AttacherTypeBackingImageDataSourceController: v1beta1.AttacherPriorityLevelBackingImageDataSourceController,
	v1beta1.AttacherTypeVolumeRebuildingController:       v1beta1.AttacherPriorityLevelVolumeRebuildingController,
}

// attacherPriority ranks a ticket's type: restore > user workload >
// snapshot and backup operations. Unknown types rank lowest.
func attacherPriority(t v1beta1.AttacherType) int { return attacherPriorities[t] }

// isInterruptible tells the tickets that yield the volume to a workload
// ticket on another node: data operations that can be retried later.
func isInterruptible(t v1beta1.AttacherType) bool {
	switch t {
	case v1beta1.AttacherTypeSnapshotController, v1beta1.AttacherTypeBackupController,
		v1beta1.AttacherTypeVolumeCloneController:
		return true
	}
	return false
}

// isWorkload tells the tickets of a user of the volume's data.
func isWorkload(t v1beta1.AttacherType) bool {
	return t == v1beta1.AttacherTypeCSIAttacher || t == v1beta1.AttacherTypeStrataAPI
}

// sortedTickets orders tickets best first: higher priority, then the
// smaller ticket ID, so every manager picks the same one.
func sortedTickets(tickets map[string]*v1beta1.AttachmentTicket) []*v1beta1.AttachmentTicket {
	out := make([]*v1beta1.AttachmentTicket, 0, len(tickets))
	for _, t := range tickets {
		if t != nil && t.NodeID != "" {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		pi, pj := attacherPriority(out[i].Type), attacherPriority(out[j].Type)
		if pi != pj {
			return pi > pj
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// selectAttachmentTicket picks the ticket a detached volume attaches for, or
// nil when no ticket asks for a node.
func selectAttachmentTicket(tickets map[string]*v1beta1.AttachmentTicket) *v1beta1.AttachmentTicket {
	if s := sortedTickets(tickets); len(s) > 0 {
		return s[0]
	}
	return nil
}

// parametersCompatible tells whether a volume attached with disableFrontend
// serves a ticket: the ticket may ask for "true", "false" (the default when
// unset, as when the volume attaches for it) or "any". Unset cannot mean
// "any": a user's ticket would then get a frontend or not depending on
// whether a restore's frontend-less attachment was still there.
func parametersCompatible(disableFrontend bool, t *v1beta1.AttachmentTicket) bool {
	switch t.Parameters[v1beta1.AttachmentParameterDisableFrontend] {
	case v1beta1.TrueValue:
		return disableFrontend
	case v1beta1.AnyValue:
		return true
	}
	return !disableFrontend
}

// fillIncomplete tells a volume whose data source (spec.dataSource) or
// backup (spec.fromBackup) has not been copied in yet: until it is, only
// the controller filling it may attach it, so no workload ever reads a
// half-filled volume.
func fillIncomplete(vol *v1beta1.Volume) bool {
	return kit.CloneIncomplete(vol) || kit.RestoreIncomplete(vol)
}

// fillerType is the attacher that fills an incomplete volume.
func fillerType(vol *v1beta1.Volume) v1beta1.AttacherType {
	if kit.RestoreIncomplete(vol) {
		return v1beta1.AttacherTypeVolumeRestoreController
	}
	return v1beta1.AttacherTypeVolumeCloneController
}

// eligibleTickets are the tickets the volume may be attached for now.
func eligibleTickets(vol *v1beta1.Volume, tickets map[string]*v1beta1.AttachmentTicket) map[string]*v1beta1.AttachmentTicket {
	if !fillIncomplete(vol) {
		return tickets
	}
	out := map[string]*v1beta1.AttachmentTicket{}
	for id, t := range tickets {
		if t != nil && t.Type == fillerType(vol) {
			out[id] = t
		}
	}
	return out
}

// fillStatusChanged: the progress a waiting ticket's message shows moved.
func fillStatusChanged(o, n *v1beta1.Volume) bool {
	return fillIncomplete(o) != fillIncomplete(n) ||
		(fillIncomplete(n) && (!equality.Semantic.DeepEqual(o.Status.CloneStatus, n.Status.CloneStatus) ||
			!equality.Semantic.DeepEqual(o.Status.RestoreStatus, n.Status.RestoreStatus)))
}

func fillWaitReason(vol *v1beta1.Volume) string {
	if kit.RestoreIncomplete(vol) {
		return TicketReasonWaitingForRestore
	}
	return TicketReasonWaitingForClone
}

// fillWaitMessage says what a ticket of another kind waits for.
func fillWaitMessage(vol *v1beta1.Volume) string {
	if kit.RestoreIncomplete(vol) {
		rs := vol.Status.RestoreStatus
		if rs == nil {
			return fmt.Sprintf("the volume is restored from backup %s first; the restore has not started", vol.Spec.FromBackup)
		}
		msg := fmt.Sprintf("the volume is restored from backup %s first; the restore is %s (%d%%)",
			vol.Spec.FromBackup, kit.OrUnknown(string(rs.State)), rs.Progress)
		if rs.Message != "" {
			msg += ": " + rs.Message
		}
		return msg
	}
	cs := vol.Status.CloneStatus
	if cs == nil {
		return fmt.Sprintf("the volume is filled from %s first; the clone has not started", vol.Spec.DataSource)
	}
	msg := fmt.Sprintf("the volume is filled from %s first; the clone is %s (%d%%)",
		vol.Spec.DataSource, kit.OrUnknown(string(cs.State)), cs.Progress)
	if cs.Message != "" {
		msg += ": " + cs.Message
	}
	return msg
}

// detachDecision says whether the AD controller clears vol.Spec.NodeID, and
// why. A migrating volume is never detached here: migrationDecision first
// confirms or rolls the migration back.
func detachDecision(vol *v1beta1.Volume, tickets map[string]*v1beta1.AttachmentTicket) (bool, string) {
	node := vol.Spec.NodeID
	if node == "" || vol.Spec.MigrationNodeID != "" {
		return false, ""
	}
	var here []*v1beta1.AttachmentTicket
	for _, t := range sortedTickets(tickets) {
		if t.NodeID == node {
			here = append(here, t)
		}
	}
	if len(here) == 0 {
		return true, fmt.Sprintf("no ticket asks for node %s", node)
	}
	compatible := false
	for _, t := range here {
		if parametersCompatible(vol.Spec.DisableFrontend, t) {
			compatible = true
		}
	}
	if !compatible {
		return true, fmt.Sprintf("the tickets for node %s ask for other attachment parameters", node)
	}
	onlyInterruptible := true
	for _, t := range here {
		if !isInterruptible(t.Type) {
			onlyInterruptible = false
		}
	}
	if onlyInterruptible {
		for _, t := range sortedTickets(tickets) {
			if t.NodeID != node && isWorkload(t.Type) {
				return true, fmt.Sprintf("ticket %s (%s) on node %s interrupts the %s on node %s",
					t.ID, t.Type, t.NodeID, here[0].Type, node)
			}
		}
	}
	return false, ""
}

// ticketStatuses computes every ticket's status from the volume as it is: a
// ticket is satisfied when the volume is fully attached to its node with
// compatible parameters, or, for a CSI ticket of a live migration, when the
// volume's migration engine runs on its node. Conditions keep their
// transition times when unchanged.
func ticketStatuses(vol *v1beta1.Volume, va *v1beta1.VolumeAttachment, now metav1.Time) map[string]*v1beta1.AttachmentTicketStatus {
	out := map[string]*v1beta1.AttachmentTicketStatus{}
	attached := vol.Status.State == v1beta1.VolumeStateAttached && vol.Status.CurrentNodeID != ""
	migrationEngine := vol.Status.CurrentMigrationNodeID
	imageFailed := kit.ImageBlocking(vol)
	for id, t := range va.Spec.AttachmentTickets {
		if t == nil {
			continue
		}
		st := &v1beta1.AttachmentTicketStatus{ID: id, Generation: t.Generation}
		if prev := va.Status.AttachmentTicketStatuses[id]; prev != nil {
			st.Conditions = append(st.Conditions, prev.Conditions...)
		}
		var ok bool
		var reason, msg string
		switch {
		case fillIncomplete(vol) && t.Type != fillerType(vol):
			reason, msg = fillWaitReason(vol), fillWaitMessage(vol)
		case attached && vol.Status.CurrentNodeID == t.NodeID && parametersCompatible(vol.Spec.DisableFrontend, t):
			ok, reason, msg = true, TicketReasonAttached, "the volume is attached to node "+t.NodeID
		case attached && vol.Status.CurrentNodeID == t.NodeID:
			reason = v1beta1.AttachmentStatusConditionReasonAttachedWithIncompatibleParameters
			msg = fmt.Sprintf("the volume is attached to node %s with disableFrontend=%v", t.NodeID, vol.Spec.DisableFrontend)
		case attached && t.Type == v1beta1.AttacherTypeCSIAttacher && migrationEngine != "" &&
			migrationEngine == t.NodeID && parametersCompatible(vol.Spec.DisableFrontend, t):
			ok, reason, msg = true, TicketReasonAttached, "the volume's migration engine runs on node "+t.NodeID
		case attached && t.Type == v1beta1.AttacherTypeCSIAttacher && vol.Spec.MigrationNodeID == t.NodeID:
			reason = TicketReasonWaitingMigration
			msg = fmt.Sprintf("the volume is migrating from node %s to node %s; waiting for its migration engine",
				vol.Status.CurrentNodeID, t.NodeID)
		case attached:
			reason = TicketReasonOtherNodeWins
			msg = "the volume is attached to node " + vol.Status.CurrentNodeID + " for a ticket of higher or equal priority"
		case imageFailed != nil:
			reason, msg = TicketReasonBackingImageFailed, "the volume cannot attach: "+imageFailed.Message
		case vol.Status.Robustness == v1beta1.VolumeRobustnessFaulted:
			reason, msg = TicketReasonVolumeNotHealthy, "the volume is faulted"
		default:
			reason, msg = TicketReasonWaitingToAttach, waitingMessage(vol)
		}
		st.Satisfied = ok
		kit.SetCondition(&st.Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied, ok, reason, msg, now)
		if c := meta.FindStatusCondition(st.Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied); c != nil {
			c.ObservedGeneration = t.Generation
		}
		out[id] = st
	}
	return out
}

// waitingMessage says what an unsatisfied ticket waits for: the volume's
// state, and its backing image while that has no ready copy.
func waitingMessage(vol *v1beta1.Volume) string {
	msg := fmt.Sprintf("the volume is %s", kit.OrUnknown(string(vol.Status.State)))
	if c := kit.ImageNotReady(vol); c != nil {
		msg += "; " + c.Message
	}
	return msg
}

// attachmentSummary is what kubectl get va shows: the node the volume is
// attached to, and how many tickets there are and are satisfied.
func attachmentSummary(vol *v1beta1.Volume, statuses map[string]*v1beta1.AttachmentTicketStatus) v1beta1.VolumeAttachmentStatus {
	s := v1beta1.VolumeAttachmentStatus{CurrentNodeID: vol.Status.CurrentNodeID, Tickets: int32(len(statuses))}
	for _, st := range statuses {
		if st.Satisfied {
			s.SatisfiedTickets++
		}
	}
	return s
}

package attachment

// The AD controller's decision on a volume's attachment fields, pure and
// tested by table: given the volume as it is and its tickets, what
// spec.nodeID, spec.migrationNodeID, spec.disableFrontend and
// spec.lastAttachedBy should be, and why. The AD controller is the only
// writer of these four fields; the volume controller drives status from them.

import (
	"fmt"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// Event reasons of the AD controller, recorded on the VolumeAttachment.
const (
	EventReasonADAttach            = "Attach"
	EventReasonADDetach            = "Detach"
	EventReasonADMigrationStart    = "MigrationStart"
	EventReasonADMigrationConfirm  = "MigrationConfirm"
	EventReasonADMigrationRollback = "MigrationRollback"
	EventReasonADUpgradeTicket     = "UpgradeTicket"
	EventReasonADTicketRemoved     = "TicketRemoved"
)

// adSpec is the part of a volume's spec the AD controller owns.
type adSpec struct {
	NodeID          string
	MigrationNodeID string
	DisableFrontend bool
	LastAttachedBy  string
}

func adSpecOf(vol *v1beta1.Volume) adSpec {
	return adSpec{NodeID: vol.Spec.NodeID, MigrationNodeID: vol.Spec.MigrationNodeID,
		DisableFrontend: vol.Spec.DisableFrontend, LastAttachedBy: vol.Spec.LastAttachedBy}
}

func (s adSpec) applyTo(vol *v1beta1.Volume) {
	vol.Spec.NodeID, vol.Spec.MigrationNodeID = s.NodeID, s.MigrationNodeID
	vol.Spec.DisableFrontend, vol.Spec.LastAttachedBy = s.DisableFrontend, s.LastAttachedBy
}

// adAction is one step of a decision, told as an event.
type adAction struct {
	Reason, Message string
}

// decideAttachment runs the AD steps in order on the volume's spec:
//  1. a live migration in progress is confirmed or rolled back;
//  2. a volume no ticket keeps on its node is detached (detachDecision);
//  3. a fully detached volume is attached for the best ticket;
//  4. an attached migratable volume starts a live migration for a CSI
//     ticket on another node.
//
// A volume being deleted is left to the volume controller.
func decideAttachment(vol *v1beta1.Volume, tickets map[string]*v1beta1.AttachmentTicket) (adSpec, []adAction) {
	s := adSpecOf(vol)
	if vol.DeletionTimestamp != nil || vol.Status.State == v1beta1.VolumeStateDeleting {
		return s, nil
	}
	// A volume being filled from its data source serves nobody else yet.
	tickets = eligibleTickets(vol, tickets)
	var actions []adAction

	if s.MigrationNodeID != "" {
		switch d, why := migrationDecision(vol, tickets); d {
		case migrationConfirm:
			actions = append(actions, adAction{EventReasonADMigrationConfirm, why})
			s.NodeID, s.MigrationNodeID = s.MigrationNodeID, ""
		case migrationRollback:
			actions = append(actions, adAction{EventReasonADMigrationRollback, why})
			s.MigrationNodeID = ""
		}
	}

	if s.NodeID != "" {
		v := vol.DeepCopy()
		s.applyTo(v)
		if detach, why := detachDecision(v, tickets); detach {
			actions = append(actions, adAction{EventReasonADDetach, fmt.Sprintf("detaching from node %s: %s", s.NodeID, why)})
			s.NodeID = ""
		}
	}

	// Attach only a volume that is fully detached and was so before this
	// decision: the volume controller must have seen the detach through.
	if fullyDetached(vol) && s.NodeID == "" && s.MigrationNodeID == "" {
		if t := selectAttachmentTicket(tickets); t != nil {
			s.NodeID = t.NodeID
			s.DisableFrontend = t.Parameters[v1beta1.AttachmentParameterDisableFrontend] == v1beta1.TrueValue
			s.LastAttachedBy = string(t.Type)
			actions = append(actions, adAction{EventReasonADAttach, fmt.Sprintf(
				"attaching to node %s for ticket %s (%s), disableFrontend=%v", t.NodeID, t.ID, t.Type, s.DisableFrontend)})
		}
	}

	// Start a migration only from a settled attachment: nothing changed above
	// and no migration engine from an earlier migration is still up.
	if len(actions) == 0 && canStartMigration(vol) {
		if t := migrationTarget(vol, tickets); t != nil {
			s.MigrationNodeID = t.NodeID
			actions = append(actions, adAction{EventReasonADMigrationStart, fmt.Sprintf(
				"migrating from node %s to node %s for ticket %s", s.NodeID, t.NodeID, t.ID)})
		}
	}
	return s, actions
}

// fullyDetached: detached in status and not asked to attach anywhere.
func fullyDetached(vol *v1beta1.Volume) bool {
	return vol.Status.State == v1beta1.VolumeStateDetached && vol.Status.CurrentNodeID == "" &&
		vol.Spec.NodeID == "" && vol.Spec.MigrationNodeID == ""
}

// canStartMigration: a migratable volume fully attached where it is asked
// to be, with no migration under way or still being torn down.
func canStartMigration(vol *v1beta1.Volume) bool {
	return vol.Spec.Migratable && vol.Spec.MigrationNodeID == "" && vol.Status.CurrentMigrationNodeID == "" &&
		vol.Spec.NodeID != "" && vol.Spec.NodeID == vol.Status.CurrentNodeID &&
		vol.Status.State == v1beta1.VolumeStateAttached
}

// csiTicketOn tells whether a CSI ticket asks for node.
func csiTicketOn(tickets map[string]*v1beta1.AttachmentTicket, node string) bool {
	for _, t := range tickets {
		if t != nil && t.Type == v1beta1.AttacherTypeCSIAttacher && t.NodeID == node {
			return true
		}
	}
	return false
}

// migrationTarget picks the CSI ticket a live migration moves the volume
// for: the volume's own node holds a CSI ticket (the workload being
// migrated) and a second CSI ticket, compatible with how the volume is
// attached, asks for another node. Among several, the first in ticket order.
func migrationTarget(vol *v1beta1.Volume, tickets map[string]*v1beta1.AttachmentTicket) *v1beta1.AttachmentTicket {
	if !csiTicketOn(tickets, vol.Spec.NodeID) {
		return nil
	}
	for _, t := range sortedTickets(tickets) {
		if t.Type == v1beta1.AttacherTypeCSIAttacher && t.NodeID != vol.Spec.NodeID &&
			parametersCompatible(vol.Spec.DisableFrontend, t) {
			return t
		}
	}
	return nil
}

type migrationStep int

const (
	migrationWait migrationStep = iota
	migrationConfirm
	migrationRollback
)

// migrationDecision decides a live migration in progress (spec.nodeID = A,
// spec.migrationNodeID = B):
//   - B's CSI ticket is gone, or the volume is no longer attached: roll back
//     (clear spec.migrationNodeID);
//   - A's CSI ticket is gone and the migration engine runs on B
//     (status.currentMigrationNodeID = B): confirm (spec.nodeID = B);
//   - otherwise wait: both workloads run, or B's engine is starting.
func migrationDecision(vol *v1beta1.Volume, tickets map[string]*v1beta1.AttachmentTicket) (migrationStep, string) {
	from, to := vol.Spec.NodeID, vol.Spec.MigrationNodeID
	switch {
	case to == "":
		return migrationWait, ""
	case from == "" || vol.Status.CurrentNodeID == "":
		return migrationRollback, fmt.Sprintf("rolling back the migration to node %s: the volume is no longer attached", to)
	case !csiTicketOn(tickets, to):
		return migrationRollback, fmt.Sprintf("rolling back the migration from node %s to node %s: no CSI ticket asks for node %s any more", from, to, to)
	case !csiTicketOn(tickets, from) && vol.Status.CurrentMigrationNodeID == to:
		return migrationConfirm, fmt.Sprintf("confirming the migration from node %s to node %s: the workload left node %s", from, to, from)
	}
	return migrationWait, ""
}

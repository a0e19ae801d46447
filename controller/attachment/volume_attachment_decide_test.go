package attachment

import (
	"testing"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func TestVolumeAttachmentDecide(t *testing.T) {
	vol := func(state v1beta1.VolumeState, specNode, currentNode string, mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
		v := &v1beta1.Volume{Spec: v1beta1.VolumeSpec{NodeID: specNode},
			Status: v1beta1.VolumeStatus{State: state, CurrentNodeID: currentNode}}
		for _, m := range mut {
			m(v)
		}
		return v
	}
	migratable := func(v *v1beta1.Volume) { v.Spec.Migratable = true }
	migrating := func(to, engineOn string) func(*v1beta1.Volume) {
		return func(v *v1beta1.Volume) {
			v.Spec.Migratable, v.Spec.MigrationNodeID, v.Status.CurrentMigrationNodeID = true, to, engineOn
		}
	}
	detached := vol(v1beta1.VolumeStateDetached, "", "")
	attached1 := vol(v1beta1.VolumeStateAttached, "node-1", "node-1")
	cloning := func(state v1beta1.VolumeCloneState) func(*v1beta1.Volume) {
		return func(v *v1beta1.Volume) {
			v.Spec.DataSource = "snap://src/s1"
			v.Status.CloneStatus = &v1beta1.VolumeCloneStatus{State: state}
		}
	}
	cloneCtl := v1beta1.AttacherTypeVolumeCloneController

	tests := []struct {
		name    string
		vol     *v1beta1.Volume
		tickets map[string]*v1beta1.AttachmentTicket
		want    adSpec
		reasons []string
	}{
		{"detached, no ticket: nothing", detached, nil, adSpec{}, nil},
		{"detached: attach for the best ticket", detached,
			fixture.Tickets(fixture.Ticket("snap", snapCtl, "node-1"), fixture.Ticket("ui", api, "node-2", disableF, "true")),
			adSpec{NodeID: "node-2", DisableFrontend: true, LastAttachedBy: string(api)}, []string{EventReasonADAttach}},
		{"disableFrontend any attaches with the frontend", detached, fixture.Tickets(fixture.Ticket("snap", snapCtl, "node-1", disableF, "any")),
			adSpec{NodeID: "node-1", LastAttachedBy: string(snapCtl)}, []string{EventReasonADAttach}},
		{"clone not done: a workload ticket waits", vol(v1beta1.VolumeStateDetached, "", "", cloning(v1beta1.VolumeCloneStateCopying)),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{}, nil},
		{"clone not done: attached for the clone only, frontend off",
			vol(v1beta1.VolumeStateDetached, "", "", cloning(v1beta1.VolumeCloneStatePending)),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-2"), fixture.Ticket("clone-v", cloneCtl, "node-1", disableF, "true")),
			adSpec{NodeID: "node-1", DisableFrontend: true, LastAttachedBy: string(cloneCtl)}, []string{EventReasonADAttach}},
		{"clone not done: a workload ticket elsewhere does not interrupt it",
			vol(v1beta1.VolumeStateAttached, "node-1", "node-1", cloning(v1beta1.VolumeCloneStateCopying),
				func(v *v1beta1.Volume) { v.Spec.DisableFrontend = true }),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-2"), fixture.Ticket("clone-v", cloneCtl, "node-1", disableF, "true")),
			adSpec{NodeID: "node-1", DisableFrontend: true}, nil},
		{"clone failed: still nobody else", vol(v1beta1.VolumeStateDetached, "", "", cloning(v1beta1.VolumeCloneStateFailed)),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{}, nil},
		{"clone completed: the workload ticket wins", vol(v1beta1.VolumeStateDetached, "", "", cloning(v1beta1.VolumeCloneStateCompleted)),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{NodeID: "node-1", LastAttachedBy: string(csi)}, []string{EventReasonADAttach}},
		{"detaching: wait", vol(v1beta1.VolumeStateDetaching, "", ""), fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{}, nil},
		{"detached in status but current node not yet cleared: wait", vol(v1beta1.VolumeStateDetached, "", "node-1"),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{}, nil},
		{"spec still names a node: detach first, attach on the next pass", vol(v1beta1.VolumeStateDetached, "node-1", ""),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-2")), adSpec{}, []string{EventReasonADDetach}},
		{"attached and wanted: nothing", attached1, fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{NodeID: "node-1"}, nil},
		{"attached, ticket gone: detach", attached1, nil, adSpec{}, []string{EventReasonADDetach}},
		{"being deleted: left to the volume controller",
			vol(v1beta1.VolumeStateAttached, "node-1", "node-1", func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }),
			nil, adSpec{NodeID: "node-1"}, nil},
		{"deleting state: left to the volume controller", vol(v1beta1.VolumeStateDeleting, "", ""),
			fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), adSpec{}, nil},

		{"migratable, second CSI ticket: start", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migratable),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2")),
			adSpec{NodeID: "node-1", MigrationNodeID: "node-2"}, []string{EventReasonADMigrationStart}},
		{"migratable, but the volume's own ticket is not CSI: no migration", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migratable),
			fixture.Tickets(fixture.Ticket("ui", api, "node-1"), fixture.Ticket("pod-b", csi, "node-2")), adSpec{NodeID: "node-1"}, nil},
		{"migratable, second ticket not CSI: no migration", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migratable),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("ui", api, "node-2")), adSpec{NodeID: "node-1"}, nil},
		{"migratable, second CSI ticket wants another frontend: no migration",
			vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migratable),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2", disableF, "true")), adSpec{NodeID: "node-1"}, nil},
		{"migratable, still attaching: no migration", vol(v1beta1.VolumeStateAttaching, "node-1", "", migratable),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2")), adSpec{NodeID: "node-1"}, nil},
		{"migratable, the last migration engine still up: no new migration",
			vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migratable, func(v *v1beta1.Volume) { v.Status.CurrentMigrationNodeID = "node-3" }),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2")), adSpec{NodeID: "node-1"}, nil},
		{"migrating, both tickets: wait", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migrating("node-2", "node-2")),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2")),
			adSpec{NodeID: "node-1", MigrationNodeID: "node-2"}, nil},
		{"migrating, source gone, engine up: confirm", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migrating("node-2", "node-2")),
			fixture.Tickets(fixture.Ticket("pod-b", csi, "node-2")), adSpec{NodeID: "node-2"}, []string{EventReasonADMigrationConfirm}},
		{"migrating, source gone, engine not up: wait", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migrating("node-2", "")),
			fixture.Tickets(fixture.Ticket("pod-b", csi, "node-2")), adSpec{NodeID: "node-1", MigrationNodeID: "node-2"}, nil},
		{"migrating, target gone: roll back", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migrating("node-2", "node-2")),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1")), adSpec{NodeID: "node-1"}, []string{EventReasonADMigrationRollback}},
		{"migrating, both gone: roll back and detach", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migrating("node-2", "")),
			nil, adSpec{}, []string{EventReasonADMigrationRollback, EventReasonADDetach}},
		{"migrating, target ticket no longer CSI: roll back", vol(v1beta1.VolumeStateAttached, "node-1", "node-1", migrating("node-2", "")),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("ui", api, "node-2")),
			adSpec{NodeID: "node-1"}, []string{EventReasonADMigrationRollback}},
		{"migration asked of a volume no longer attached: roll back", vol(v1beta1.VolumeStateDetached, "node-1", "", migrating("node-2", "")),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2")),
			adSpec{NodeID: "node-1"}, []string{EventReasonADMigrationRollback}},
		{"confirmed, volume controller switching over: nothing more",
			vol(v1beta1.VolumeStateAttached, "node-2", "node-1", migratable, func(v *v1beta1.Volume) { v.Status.CurrentMigrationNodeID = "node-2" }),
			fixture.Tickets(fixture.Ticket("pod-b", csi, "node-2")), adSpec{NodeID: "node-2"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, actions := decideAttachment(tc.vol, tc.tickets)
			assert.Equal(t, tc.want, got)
			var reasons []string
			for _, a := range actions {
				reasons = append(reasons, a.Reason)
				assert.NotEmpty(t, a.Message)
			}
			assert.Equal(t, tc.reasons, reasons)
		})
	}
}

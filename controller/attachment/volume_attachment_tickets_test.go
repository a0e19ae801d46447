package attachment

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const (
	csi      = v1beta1.AttacherTypeCSIAttacher
	api      = v1beta1.AttacherTypeStrataAPI
	snapCtl  = v1beta1.AttacherTypeSnapshotController
	backup   = v1beta1.AttacherTypeBackupController
	restore  = v1beta1.AttacherTypeVolumeRestoreController
	disableF = v1beta1.AttachmentParameterDisableFrontend
)

func TestSelectAttachmentTicket(t *testing.T) {
	tests := []struct {
		name    string
		tickets map[string]*v1beta1.AttachmentTicket
		want    string
	}{
		{"none", nil, ""},
		{"workload beats snapshot", fixture.Tickets(fixture.Ticket("snap-1", snapCtl, "node-1"), fixture.Ticket("pod-a", csi, "node-2")), "pod-a"},
		{"restore beats everyone", fixture.Tickets(fixture.Ticket("snap-1", snapCtl, "node-1"), fixture.Ticket("pod-a", csi, "node-2"),
			fixture.Ticket("restore", restore, "node-3")), "restore"},
		{"strata-api beats csi", fixture.Tickets(fixture.Ticket("pod-a", csi, "node-2"), fixture.Ticket("ui", api, "node-1")), "ui"},
		{"equal priority: smaller ticket ID", fixture.Tickets(fixture.Ticket("pod-b", csi, "node-2"), fixture.Ticket("pod-a", csi, "node-1")), "pod-a"},
		{"a ticket without a node is ignored", fixture.Tickets(fixture.Ticket("pod-a", csi, ""), fixture.Ticket("bk", backup, "node-3")), "bk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := selectAttachmentTicket(tc.tickets)
			if tc.want == "" {
				assert.Nil(t, got)
				return
			}
			require.NotNil(t, got)
			assert.Equal(t, tc.want, got.ID)
		})
	}
}

func volumeOn(node string, disableFrontend bool) *v1beta1.Volume {
	return &v1beta1.Volume{Spec: v1beta1.VolumeSpec{NodeID: node, DisableFrontend: disableFrontend}}
}

func TestDetachDecision(t *testing.T) {
	tests := []struct {
		name       string
		vol        *v1beta1.Volume
		tickets    map[string]*v1beta1.AttachmentTicket
		wantDetach bool
		wantReason string
	}{
		{"not attached: nothing to detach", volumeOn("", false), fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), false, ""},
		{"a ticket wants the node", volumeOn("node-1", false), fixture.Tickets(fixture.Ticket("pod", csi, "node-1")), false, ""},
		{"no ticket wants the node", volumeOn("node-1", false), fixture.Tickets(fixture.Ticket("pod", csi, "node-2")), true,
			"no ticket asks for node node-1"},
		{"all tickets gone", volumeOn("node-1", false), nil, true, "no ticket asks for node node-1"},
		{"incompatible parameters", volumeOn("node-1", true), fixture.Tickets(fixture.Ticket("pod", csi, "node-1", disableF, "false")), true,
			"the tickets for node node-1 ask for other attachment parameters"},
		{"any parameter is compatible", volumeOn("node-1", true), fixture.Tickets(fixture.Ticket("snap", snapCtl, "node-1", disableF, "any")), false, ""},
		{"snapshot yields to a workload elsewhere", volumeOn("node-1", true),
			fixture.Tickets(fixture.Ticket("snap", snapCtl, "node-1", disableF, "any"), fixture.Ticket("pod", csi, "node-2")), true,
			"ticket pod (csi-attacher) on node node-2 interrupts the snapshot-controller on node node-1"},
		{"snapshot keeps the volume against another snapshot", volumeOn("node-1", true),
			fixture.Tickets(fixture.Ticket("snap", snapCtl, "node-1", disableF, "any"), fixture.Ticket("bk", backup, "node-2", disableF, "any")), false, ""},
		{"an unset parameter asks for the frontend", volumeOn("node-1", true), fixture.Tickets(fixture.Ticket("ui", api, "node-1")), true,
			"the tickets for node node-1 ask for other attachment parameters"},
		{"a workload is never interrupted", volumeOn("node-1", false),
			fixture.Tickets(fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("ui", api, "node-2")), false, ""},
		{"a migrating volume is left to the migration decision", func() *v1beta1.Volume {
			v := volumeOn("node-1", false)
			v.Spec.MigrationNodeID = "node-2"
			return v
		}(), fixture.Tickets(fixture.Ticket("pod-b", csi, "node-2")), false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			detach, reason := detachDecision(tc.vol, tc.tickets)
			assert.Equal(t, tc.wantDetach, detach)
			assert.Equal(t, tc.wantReason, reason)
		})
	}
}

func TestTicketStatuses(t *testing.T) {
	now := metav1.NewTime(dstest.Now)
	attachedTo := func(node string, disableFrontend bool) *v1beta1.Volume {
		v := volumeOn(node, disableFrontend)
		v.Status.State, v.Status.CurrentNodeID = v1beta1.VolumeStateAttached, node
		return v
	}
	detached := &v1beta1.Volume{Status: v1beta1.VolumeStatus{State: v1beta1.VolumeStateDetached}}
	faulted := &v1beta1.Volume{Status: v1beta1.VolumeStatus{State: v1beta1.VolumeStateDetached, Robustness: v1beta1.VolumeRobustnessFaulted}}
	va := &v1beta1.VolumeAttachment{Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: fixture.Tickets(
		fixture.Ticket("pod", csi, "node-1", disableF, "false"), fixture.Ticket("snap", snapCtl, "node-2"))}}

	tests := []struct {
		name   string
		vol    *v1beta1.Volume
		want   map[string]bool
		reason map[string]string
	}{
		{"attached where pod asked", attachedTo("node-1", false), map[string]bool{"pod": true, "snap": false},
			map[string]string{"pod": TicketReasonAttached, "snap": TicketReasonOtherNodeWins}},
		{"attached with incompatible parameters", attachedTo("node-1", true), map[string]bool{"pod": false, "snap": false},
			map[string]string{"pod": v1beta1.AttachmentStatusConditionReasonAttachedWithIncompatibleParameters, "snap": TicketReasonOtherNodeWins}},
		{"detached", detached, map[string]bool{"pod": false, "snap": false},
			map[string]string{"pod": TicketReasonWaitingToAttach, "snap": TicketReasonWaitingToAttach}},
		{"faulted", faulted, map[string]bool{"pod": false, "snap": false},
			map[string]string{"pod": TicketReasonVolumeNotHealthy, "snap": TicketReasonVolumeNotHealthy}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ticketStatuses(tc.vol, va, now)
			require.Len(t, got, 2)
			for id, want := range tc.want {
				assert.Equal(t, want, got[id].Satisfied, id)
				assert.EqualValues(t, 1, got[id].Generation)
				c := meta.FindStatusCondition(got[id].Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied)
				require.NotNil(t, c, id)
				assert.Equal(t, tc.reason[id], c.Reason, id)
				assert.EqualValues(t, 1, c.ObservedGeneration)
			}
		})
	}
}

func TestTicketStatusesDuringMigration(t *testing.T) {
	now := metav1.NewTime(dstest.Now)
	va := &v1beta1.VolumeAttachment{Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: fixture.Tickets(
		fixture.Ticket("pod-a", csi, "node-1"), fixture.Ticket("pod-b", csi, "node-2"), fixture.Ticket("ui", api, "node-2"))}}
	vol := func(specNode, migrationNode, currentNode, engineOn string) *v1beta1.Volume {
		v := volumeOn(specNode, false)
		v.Spec.Migratable, v.Spec.MigrationNodeID = true, migrationNode
		v.Status.State, v.Status.CurrentNodeID, v.Status.CurrentMigrationNodeID = v1beta1.VolumeStateAttached, currentNode, engineOn
		return v
	}
	tests := []struct {
		name string
		vol  *v1beta1.Volume
		want map[string]string // id -> "satisfied reason"
	}{
		{"migration asked, engine starting", vol("node-1", "node-2", "node-1", ""), map[string]string{
			"pod-a": "true " + TicketReasonAttached,
			"pod-b": "false " + TicketReasonWaitingMigration,
			"ui":    "false " + TicketReasonOtherNodeWins}},
		{"migration engine running: the CSI ticket on the target is satisfied, nothing else there",
			vol("node-1", "node-2", "node-1", "node-2"), map[string]string{
				"pod-a": "true " + TicketReasonAttached,
				"pod-b": "true " + TicketReasonAttached,
				"ui":    "false " + TicketReasonOtherNodeWins}},
		{"confirmed, the volume controller not yet switched over", vol("node-2", "", "node-1", "node-2"), map[string]string{
			"pod-a": "true " + TicketReasonAttached,
			"pod-b": "true " + TicketReasonAttached,
			"ui":    "false " + TicketReasonOtherNodeWins}},
		{"switched over", vol("node-2", "", "node-2", ""), map[string]string{
			"pod-a": "false " + TicketReasonOtherNodeWins,
			"pod-b": "true " + TicketReasonAttached,
			"ui":    "true " + TicketReasonAttached}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ticketStatuses(tc.vol, va, now)
			require.Len(t, got, len(tc.want))
			for id, want := range tc.want {
				c := meta.FindStatusCondition(got[id].Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied)
				require.NotNil(t, c, id)
				assert.Equal(t, want, fmt.Sprintf("%v %s", got[id].Satisfied, c.Reason), id)
			}
		})
	}
}

func TestTicketStatusesKeepTransitionTimes(t *testing.T) {
	before, later := metav1.NewTime(dstest.Now.Add(-time.Hour)), metav1.NewTime(dstest.Now)
	vol := volumeOn("node-1", false)
	vol.Status.State, vol.Status.CurrentNodeID = v1beta1.VolumeStateAttached, "node-1"
	va := &v1beta1.VolumeAttachment{Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: fixture.Tickets(fixture.Ticket("pod", csi, "node-1"))}}
	va.Status.AttachmentTicketStatuses = ticketStatuses(vol, va, before)

	again := ticketStatuses(vol, va, later)
	assert.Equal(t, va.Status.AttachmentTicketStatuses, again, "unchanged: identical, so nothing is written")

	vol.Status.State, vol.Status.CurrentNodeID = v1beta1.VolumeStateDetaching, ""
	changed := ticketStatuses(vol, va, later)
	c := meta.FindStatusCondition(changed["pod"].Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied)
	require.NotNil(t, c)
	assert.Equal(t, later, c.LastTransitionTime, "a flip moves the transition time")
	assert.Equal(t, metav1.ConditionTrue,
		meta.FindStatusCondition(va.Status.AttachmentTicketStatuses["pod"].Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied).Status,
		"the previous statuses are not mutated")
}

func TestAttachmentSummary(t *testing.T) {
	statuses := map[string]*v1beta1.AttachmentTicketStatus{
		"a": {ID: "a", Satisfied: true}, "b": {ID: "b"}, "c": {ID: "c", Satisfied: true}}
	tests := []struct {
		name     string
		node     string
		statuses map[string]*v1beta1.AttachmentTicketStatus
		want     v1beta1.VolumeAttachmentStatus
	}{
		{"attached, two of three satisfied", "node-1", statuses,
			v1beta1.VolumeAttachmentStatus{CurrentNodeID: "node-1", Tickets: 3, SatisfiedTickets: 2}},
		{"detached, none", "", nil, v1beta1.VolumeAttachmentStatus{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vol := &v1beta1.Volume{Status: v1beta1.VolumeStatus{CurrentNodeID: tc.node}}
			assert.Equal(t, tc.want, attachmentSummary(vol, tc.statuses))
		})
	}
}

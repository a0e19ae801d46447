package attachment

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const adVolName = "v1"

// adVolume is volume v1, reconciled by node-1, in the given state.
func adVolume(state v1beta1.VolumeState, specNode, currentNode string, mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
	v := &v1beta1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: adVolName, Namespace: fixture.NS, UID: "vol-uid"},
		Spec:       v1beta1.VolumeSpec{NodeID: specNode},
		Status: v1beta1.VolumeStatus{OwnerID: "node-1", State: state, CurrentNodeID: currentNode,
			Robustness: v1beta1.VolumeRobustnessHealthy},
	}
	for _, m := range mut {
		m(v)
	}
	return v
}

func adMigratable(v *v1beta1.Volume) { v.Spec.Migratable = true }

func adMigrating(to, engineOn string) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Spec.Migratable, v.Spec.MigrationNodeID, v.Status.CurrentMigrationNodeID = true, to, engineOn
	}
}

func adVA(ts ...*v1beta1.AttachmentTicket) *v1beta1.VolumeAttachment {
	return &v1beta1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: adVolName, Namespace: fixture.NS, Labels: map[string]string{types.LabelVolume: adVolName}},
		Spec:       v1beta1.VolumeAttachmentSpec{Volume: adVolName, AttachmentTickets: fixture.Tickets(ts...)},
	}
}

// adWithStatuses sets the statuses the controller would compute for vol, so
// a case starts from a settled VolumeAttachment.
func adWithStatuses(va *v1beta1.VolumeAttachment, vol *v1beta1.Volume) *v1beta1.VolumeAttachment {
	statuses := ticketStatuses(vol, va, metav1.NewTime(dstest.Now.Add(-time.Hour)))
	va.Status = attachmentSummary(vol, statuses)
	va.Status.AttachmentTicketStatuses = statuses
	return va
}

func ownedBy(t *v1beta1.AttachmentTicket, apiVersion, kind, namespace, name, uid string) *v1beta1.AttachmentTicket {
	t.OwnerRef = &v1beta1.TicketOwnerReference{APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name, UID: uid}
	return t
}

func adSnapshot(name, uid string) *v1beta1.Snapshot {
	return &v1beta1.Snapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fixture.NS, UID: k8stypes.UID(uid)},
		Spec: v1beta1.SnapshotSpec{Volume: adVolName}}
}

func adStorageVA(name, uid string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, UID: k8stypes.UID(uid)}}
}

// adEnv starts a datastore with node-1 and node-2 alive, and the controller of node-1.
func adEnv(t *testing.T, strata, kube []runtime.Object) (*dstest.Env, *VolumeAttachmentController, *record.FakeRecorder) {
	t.Helper()
	strata = append(strata, fixture.Node("node-1", nil), fixture.Node("node-2", nil))
	kube = append(kube, fixture.Lease("node-1", 0), fixture.Lease("node-2", 0))
	env := dstest.New(t, strata, kube)
	rec := record.NewFakeRecorder(20)
	c, err := NewVolumeAttachmentController(logrus.New(), env.DS, rec, "node-1")
	require.NoError(t, err)
	env.ClearActions()
	return env, c, rec
}

// statusSummary renders ticket statuses as "id: satisfied reason".
func statusSummary(sts map[string]*v1beta1.AttachmentTicketStatus) []string {
	var out []string
	for id, st := range sts {
		reason := ""
		if c := meta.FindStatusCondition(st.Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied); c != nil {
			reason = c.Reason
		}
		out = append(out, fmt.Sprintf("%s: %v %s", id, st.Satisfied, reason))
	}
	sort.Strings(out)
	return out
}

func TestVolumeAttachmentControllerSync(t *testing.T) {
	attached1 := adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1")
	podOn1 := func() *v1beta1.AttachmentTicket { return fixture.Ticket("pod-a", csi, "node-1") }
	settled := adWithStatuses(adVA(podOn1()), attached1)
	migrating := adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", adMigrating("node-2", "node-2"))

	tests := []struct {
		name       string
		vol        *v1beta1.Volume
		va         *v1beta1.VolumeAttachment
		strata     []runtime.Object // more Strata objects (owners, node-3)
		kube       []runtime.Object
		setup      func(env *dstest.Env)
		apiErr     *fixture.ReactorError
		wantErr    string
		wantWrites []string
		wantEvents []string
		// wantSpec is the volume's AD fields after the sync; nil: unchanged.
		wantSpec *adSpec
		// wantTickets are the ticket IDs left; nil: unchanged.
		wantTickets []string
		// wantStatuses summarises the ticket statuses; nil: not checked.
		wantStatuses []string
	}{
		// Creation and the upgrade path.
		{
			name:       "a volume without a VolumeAttachment gets one",
			vol:        adVolume(v1beta1.VolumeStateCreating, "", ""),
			wantWrites: []string{"create volumeattachments v1"},
		},
		{
			name:       "an attached volume without one gets an upgrade ticket of its last attacher",
			vol:        adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", func(v *v1beta1.Volume) { v.Spec.LastAttachedBy = string(csi) }),
			wantWrites: []string{"create volumeattachments v1"},
			wantEvents: []string{"Normal UpgradeTicket"},
		},
		{
			name:       "a volume being deleted gets none",
			vol:        adVolume(v1beta1.VolumeStateDeleting, "", ""),
			wantWrites: nil,
		},
		// Attach.
		{
			name:         "a detached volume attaches for its ticket, with the ticket's parameters",
			vol:          adVolume(v1beta1.VolumeStateDetached, "", ""),
			va:           adVA(fixture.Ticket("snap-1", snapCtl, "node-2", disableF, "true")),
			wantWrites:   []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal Attach"},
			wantSpec:     &adSpec{NodeID: "node-2", DisableFrontend: true, LastAttachedBy: string(snapCtl)},
			wantStatuses: []string{"snap-1: false " + TicketReasonWaitingToAttach},
		},
		{
			name:       "a workload on node-2 beats a snapshot on node-1",
			vol:        adVolume(v1beta1.VolumeStateDetached, "", ""),
			va:         adVA(fixture.Ticket("snap-1", snapCtl, "node-1"), fixture.Ticket("pod-a", csi, "node-2", disableF, "false")),
			wantWrites: []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents: []string{"Normal Attach"},
			wantSpec:   &adSpec{NodeID: "node-2", LastAttachedBy: string(csi)},
		},
		{
			name: "a restore beats both",
			vol:  adVolume(v1beta1.VolumeStateDetached, "", ""),
			va: adVA(fixture.Ticket("snap-1", snapCtl, "node-1"), fixture.Ticket("pod-a", csi, "node-2"),
				fixture.Ticket("restore", restore, "node-3", disableF, "true")),
			wantWrites: []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents: []string{"Normal Attach"},
			wantSpec:   &adSpec{NodeID: "node-3", DisableFrontend: true, LastAttachedBy: string(restore)},
		},
		{
			name:         "no attach while the volume is still detaching",
			vol:          adVolume(v1beta1.VolumeStateDetaching, "", ""),
			va:           adVA(fixture.Ticket("pod-a", csi, "node-2")),
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantSpec:     &adSpec{},
			wantStatuses: []string{"pod-a: false " + TicketReasonWaitingToAttach},
		},
		{
			name:       "no attach while the volume is asked to attach elsewhere",
			vol:        adVolume(v1beta1.VolumeStateAttaching, "node-1", ""),
			va:         adVA(podOn1(), fixture.Ticket("ui", api, "node-2")),
			wantWrites: []string{"update volumeattachments/status v1"},
			wantSpec:   &adSpec{NodeID: "node-1"},
		},
		// Detach.
		{
			name: "the volume detaches when its ticket goes, and the gone ticket's status goes too",
			vol:  attached1,
			va: func() *v1beta1.VolumeAttachment {
				va := adVA()
				va.Status.AttachmentTicketStatuses = settled.Status.AttachmentTicketStatuses
				return va
			}(),
			wantWrites:   []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal Detach"},
			wantSpec:     &adSpec{},
			wantStatuses: []string{},
		},
		{
			name:         "a snapshot yields to a workload on another node",
			vol:          adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", func(v *v1beta1.Volume) { v.Spec.DisableFrontend = true }),
			va:           adVA(fixture.Ticket("snap-1", snapCtl, "node-1", disableF, "any"), fixture.Ticket("pod-b", csi, "node-2")),
			wantWrites:   []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal Detach"},
			wantSpec:     &adSpec{DisableFrontend: true},
			wantStatuses: []string{"pod-b: false " + TicketReasonOtherNodeWins, "snap-1: true " + TicketReasonAttached},
		},
		// Statuses.
		{
			name:         "statuses are written with their reasons",
			vol:          attached1,
			va:           adVA(podOn1(), fixture.Ticket("ui", api, "node-2")),
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached, "ui: false " + TicketReasonOtherNodeWins},
		},
		{
			name:         "unchanged statuses are not rewritten",
			vol:          attached1,
			va:           settled,
			wantWrites:   nil,
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached},
		},
		// Live migration.
		{
			name:         "a second CSI ticket on a migratable volume starts a migration",
			vol:          adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", adMigratable),
			va:           adVA(podOn1(), fixture.Ticket("pod-b", csi, "node-2")),
			wantWrites:   []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal MigrationStart"},
			wantSpec:     &adSpec{NodeID: "node-1", MigrationNodeID: "node-2"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached, "pod-b: false " + TicketReasonWaitingMigration},
		},
		{
			name:         "a volume that is not migratable keeps the second CSI ticket waiting",
			vol:          attached1,
			va:           adVA(podOn1(), fixture.Ticket("pod-b", csi, "node-2")),
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached, "pod-b: false " + TicketReasonOtherNodeWins},
		},
		{
			name:         "the migration ticket is satisfied once the migration engine runs",
			vol:          migrating,
			va:           adVA(podOn1(), fixture.Ticket("pod-b", csi, "node-2")),
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached, "pod-b: true " + TicketReasonAttached},
		},
		{
			name:         "the source's ticket going confirms the migration",
			vol:          migrating,
			va:           adVA(fixture.Ticket("pod-b", csi, "node-2")),
			wantWrites:   []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal MigrationConfirm"},
			wantSpec:     &adSpec{NodeID: "node-2"},
			wantStatuses: []string{"pod-b: true " + TicketReasonAttached},
		},
		{
			name:         "no confirmation before the migration engine runs",
			vol:          adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", adMigrating("node-2", "")),
			va:           adVA(fixture.Ticket("pod-b", csi, "node-2")),
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantSpec:     &adSpec{NodeID: "node-1", MigrationNodeID: "node-2"},
			wantStatuses: []string{"pod-b: false " + TicketReasonWaitingMigration},
		},
		{
			name:         "the target's ticket going rolls the migration back",
			vol:          migrating,
			va:           adVA(podOn1()),
			wantWrites:   []string{"update volumes v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal MigrationRollback"},
			wantSpec:     &adSpec{NodeID: "node-1"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached},
		},
		{
			name:       "both tickets going rolls back and detaches",
			vol:        migrating,
			va:         adVA(),
			wantWrites: []string{"update volumes v1", "update volumeattachments/status v1"}, // the attached node, until detached
			wantEvents: []string{"Normal MigrationRollback", "Normal Detach"},
			wantSpec:   &adSpec{},
		},
		// The reaper.
		{
			name:         "a ticket whose Snapshot is gone is removed before the decision",
			vol:          attached1,
			va:           adVA(podOn1(), ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-1", "s-uid")),
			wantWrites:   []string{"update volumeattachments v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal TicketRemoved"},
			wantTickets:  []string{"pod-a"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached},
		},
		{
			name:        "a ticket whose Snapshot was replaced (another UID) is removed, and the volume detaches",
			vol:         attached1,
			va:          adVA(ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", "", "snap-1", "old-uid")),
			strata:      []runtime.Object{adSnapshot("snap-1", "new-uid")},
			wantWrites:  []string{"update volumeattachments v1", "update volumes v1", "update volumeattachments/status v1"},
			wantEvents:  []string{"Normal TicketRemoved", "Normal Detach"},
			wantTickets: []string{},
			wantSpec:    &adSpec{},
		},
		{
			name:         "a ticket whose Snapshot exists is kept",
			vol:          attached1,
			va:           adVA(ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-1", "s-uid")),
			strata:       []runtime.Object{adSnapshot("snap-1", "s-uid")},
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantTickets:  []string{"snap-1"},
			wantStatuses: []string{"snap-1: true " + TicketReasonAttached},
		},
		{
			name: "a ticket whose Snapshot the cache has not seen yet is kept (the API server has it)",
			vol:  attached1,
			va:   adVA(ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-1", "s-uid")),
			setup: func(env *dstest.Env) {
				env.Strata.PrependReactor("get", "snapshots", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, adSnapshot("snap-1", "s-uid"), nil
				})
			},
			wantWrites:  []string{"update volumeattachments/status v1"},
			wantTickets: []string{"snap-1"},
		},
		{
			name: "a CSI ticket whose Kubernetes VolumeAttachment is gone is removed; one whose is there is kept",
			vol:  attached1,
			va: adVA(ownedBy(fixture.Ticket("csi-gone", csi, "node-1"), "storage.k8s.io/v1", "VolumeAttachment", "", "csi-gone", "g"),
				ownedBy(podOn1(), "storage.k8s.io/v1", "VolumeAttachment", "", "csi-here", "h")),
			kube:         []runtime.Object{adStorageVA("csi-here", "h")},
			wantWrites:   []string{"update volumeattachments v1", "update volumeattachments/status v1"},
			wantEvents:   []string{"Normal TicketRemoved"},
			wantTickets:  []string{"pod-a"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached},
		},
		{
			name:         "a ticket owned by a kind nobody watches is kept, and says so",
			vol:          attached1,
			va:           adVA(ownedBy(podOn1(), "example.com/v1", "Widget", "default", "w", "u")),
			wantWrites:   []string{"update volumeattachments/status v1"},
			wantTickets:  []string{"pod-a"},
			wantStatuses: []string{"pod-a: true " + TicketReasonAttached},
		},
		// Responsibility, deletion, errors.
		{
			name:       "a volume reconciled by node-2 is left to node-2",
			vol:        adVolume(v1beta1.VolumeStateDetached, "", "", func(v *v1beta1.Volume) { v.Status.OwnerID = "node-2" }),
			va:         adVA(fixture.Ticket("pod-a", csi, "node-2")),
			wantWrites: nil,
			wantSpec:   &adSpec{},
		},
		{
			name: "a VolumeAttachment being deleted is left alone",
			vol:  adVolume(v1beta1.VolumeStateDetached, "", ""),
			va: func() *v1beta1.VolumeAttachment {
				va := adVA(fixture.Ticket("pod-a", csi, "node-2"))
				va.DeletionTimestamp, va.Finalizers = &metav1.Time{Time: dstest.Now}, []string{"foreground"}
				return va
			}(),
			wantWrites: nil,
			wantSpec:   &adSpec{},
		},
		{
			name:       "a conflict writing the volume is returned for retry",
			vol:        adVolume(v1beta1.VolumeStateDetached, "", ""),
			va:         adVA(fixture.Ticket("pod-a", csi, "node-2")),
			apiErr:     &fixture.ReactorError{Verb: "update", Resource: "volumes", Err: apierrors.NewConflict(v1beta1.Resource("volumes"), adVolName, fmt.Errorf("stale"))},
			wantErr:    "Operation cannot be fulfilled",
			wantWrites: []string{"update volumes v1"},
			wantSpec:   &adSpec{},
		},
		{
			name:        "a conflict removing a ticket is returned for retry",
			vol:         attached1,
			va:          adVA(podOn1(), ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-1", "s-uid")),
			apiErr:      &fixture.ReactorError{Verb: "update", Resource: "volumeattachments", Err: apierrors.NewConflict(v1beta1.Resource("volumeattachments"), adVolName, fmt.Errorf("stale"))},
			wantErr:     "Operation cannot be fulfilled",
			wantWrites:  []string{"update volumeattachments v1"},
			wantTickets: []string{"pod-a", "snap-1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			strata := append([]runtime.Object{tc.vol.DeepCopy()}, tc.strata...)
			if tc.va != nil {
				strata = append(strata, tc.va.DeepCopy())
			}
			env, c, rec := adEnv(t, strata, tc.kube)
			if tc.setup != nil {
				tc.setup(env)
			}
			if tc.apiErr != nil {
				tc.apiErr.Install(env.Strata)
			}

			err := c.syncVolumeAttachment(context.Background(), fixture.NS+"/"+adVolName)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				assert.True(t, apierrors.IsConflict(err), "a conflict stays a conflict for the retry: %v", err)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()))
			fixture.AssertEvents(t, tc.wantEvents, rec)

			ctx := context.Background()
			vol, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(ctx, adVolName, metav1.GetOptions{})
			require.NoError(t, err)
			if tc.wantSpec != nil {
				assert.Equal(t, *tc.wantSpec, adSpecOf(vol), "volume AD fields")
			} else {
				assert.Equal(t, adSpecOf(tc.vol), adSpecOf(vol), "volume AD fields unchanged")
			}
			va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(ctx, adVolName, metav1.GetOptions{})
			if tc.va == nil && len(tc.wantWrites) == 0 {
				require.True(t, apierrors.IsNotFound(err), "no VolumeAttachment expected, got %v", err)
				return
			}
			require.NoError(t, err)
			if tc.wantTickets != nil {
				assert.ElementsMatch(t, tc.wantTickets, slices.Sorted(maps.Keys(va.Spec.AttachmentTickets)), "tickets")
			}
			if tc.wantStatuses != nil {
				assert.ElementsMatch(t, tc.wantStatuses, statusSummary(va.Status.AttachmentTicketStatuses), "ticket statuses")
			}
		})
	}
}

func TestVolumeAttachmentCreatedForVolume(t *testing.T) {
	tests := []struct {
		name       string
		vol        *v1beta1.Volume
		wantTicket *v1beta1.AttachmentTicket
	}{
		{"detached: no ticket", adVolume(v1beta1.VolumeStateDetached, "", ""), nil},
		{"attached by csi-attacher: a csi-attacher ticket",
			adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", func(v *v1beta1.Volume) { v.Spec.LastAttachedBy = string(csi) }),
			&v1beta1.AttachmentTicket{ID: "upgrade-node-1", Type: csi, NodeID: "node-1",
				Parameters: map[string]string{disableF: "false"}}},
		{"attached by nobody known: a strata-api ticket keeping the frontend as it is",
			adVolume(v1beta1.VolumeStateAttached, "node-2", "node-2", func(v *v1beta1.Volume) { v.Spec.DisableFrontend = true }),
			&v1beta1.AttachmentTicket{ID: "upgrade-node-2", Type: api, NodeID: "node-2",
				Parameters: map[string]string{disableF: "true"}}},
		{"attached by a snapshot: a strata-api ticket (nobody would remove a snapshot ticket it did not make)",
			adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1", func(v *v1beta1.Volume) { v.Spec.LastAttachedBy = string(snapCtl) }),
			&v1beta1.AttachmentTicket{ID: "upgrade-node-1", Type: api, NodeID: "node-1",
				Parameters: map[string]string{disableF: "false"}}},
		{"being attached: the ticket keeps the attachment going",
			adVolume(v1beta1.VolumeStateAttaching, "node-1", "", func(v *v1beta1.Volume) { v.Spec.LastAttachedBy = string(api) }),
			&v1beta1.AttachmentTicket{ID: "upgrade-node-1", Type: api, NodeID: "node-1",
				Parameters: map[string]string{disableF: "false"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env, c, rec := adEnv(t, []runtime.Object{tc.vol}, nil)
			require.NoError(t, c.syncVolumeAttachment(context.Background(), fixture.NS+"/"+adVolName))
			va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), adVolName, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, adVolName, va.Spec.Volume)
			assert.Equal(t, map[string]string{types.LabelVolume: adVolName}, va.Labels)
			require.Len(t, va.OwnerReferences, 1)
			ref := va.OwnerReferences[0]
			assert.Equal(t, metav1.OwnerReference{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: adVolName,
				UID: "vol-uid", Controller: ref.Controller, BlockOwnerDeletion: ref.BlockOwnerDeletion}, ref)
			assert.True(t, *ref.Controller)
			assert.True(t, *ref.BlockOwnerDeletion, "the garbage collector removes it with the volume")
			if tc.wantTicket == nil {
				assert.Empty(t, va.Spec.AttachmentTickets)
				fixture.AssertEvents(t, nil, rec)
				return
			}
			assert.Equal(t, map[string]*v1beta1.AttachmentTicket{tc.wantTicket.ID: tc.wantTicket}, va.Spec.AttachmentTickets)
			fixture.AssertEvents(t, []string{"Normal UpgradeTicket"}, rec)
		})
	}
}

func TestVolumeAttachmentUnwatchedOwnerCondition(t *testing.T) {
	vol := adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1")
	env, c, _ := adEnv(t, []runtime.Object{vol,
		adVA(ownedBy(fixture.Ticket("pod-a", csi, "node-1"), "example.com/v1", "Widget", "default", "w", "u"))}, nil)
	require.NoError(t, c.syncVolumeAttachment(context.Background(), fixture.NS+"/"+adVolName))
	va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), adVolName, metav1.GetOptions{})
	require.NoError(t, err)
	cond := meta.FindStatusCondition(va.Status.AttachmentTicketStatuses["pod-a"].Conditions, TicketConditionTypeOwnerWatched)
	require.NotNil(t, cond)
	assert.Equal(t, metav1.ConditionFalse, cond.Status)
	assert.Equal(t, TicketReasonOwnerKindNotWatched, cond.Reason)
	assert.Contains(t, cond.Message, "Widget.example.com")
}

func TestVolumeAttachmentVolumeUpdateFilter(t *testing.T) {
	base := adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1")
	tests := []struct {
		name   string
		mutate func(v *v1beta1.Volume)
		want   bool
	}{
		{"nothing", func(*v1beta1.Volume) {}, false},
		{"size", func(v *v1beta1.Volume) { v.Status.ActualSize = 42; v.Status.CurrentSize = 7 }, false},
		{"conditions", func(v *v1beta1.Volume) { v.Status.Conditions = []metav1.Condition{{Type: "X"}} }, false},
		{"the BackingImageReady condition, which ticket messages quote", func(v *v1beta1.Volume) {
			v.Status.Conditions = []metav1.Condition{{Type: kit.VolumeConditionBackingImageReady, Status: metav1.ConditionFalse,
				Reason: kit.BackingImageReadyReasonFailed, Message: "backing image img failed: x"}}
		}, true},
		{"frontend endpoint", func(v *v1beta1.Volume) { v.Status.FrontendEndpoint = "nbd://x" }, false},
		{"replica count", func(v *v1beta1.Volume) { v.Spec.NumberOfReplicas = 5 }, false},
		{"last attached by (written by the AD controller, read by nobody here)",
			func(v *v1beta1.Volume) { v.Spec.LastAttachedBy = "x" }, false},
		{"spec.nodeID", func(v *v1beta1.Volume) { v.Spec.NodeID = "" }, true},
		{"spec.migrationNodeID", func(v *v1beta1.Volume) { v.Spec.MigrationNodeID = "node-2" }, true},
		{"spec.disableFrontend", func(v *v1beta1.Volume) { v.Spec.DisableFrontend = true }, true},
		{"spec.migratable", func(v *v1beta1.Volume) { v.Spec.Migratable = true }, true},
		{"status.state", func(v *v1beta1.Volume) { v.Status.State = v1beta1.VolumeStateDetaching }, true},
		{"status.currentNodeID", func(v *v1beta1.Volume) { v.Status.CurrentNodeID = "" }, true},
		{"status.currentMigrationNodeID", func(v *v1beta1.Volume) { v.Status.CurrentMigrationNodeID = "node-2" }, true},
		{"status.ownerID", func(v *v1beta1.Volume) { v.Status.OwnerID = "node-2" }, true},
		{"status.robustness", func(v *v1beta1.Volume) { v.Status.Robustness = v1beta1.VolumeRobustnessFaulted }, true},
		{"deletion", func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := base.DeepCopy()
			tc.mutate(n)
			assert.Equal(t, tc.want, volumeChangeMattersForAD(base, n))
		})
	}
}

// TestVolumeAttachmentEnqueue drives the informers: volume updates enqueue
// only when an AD field changes, and an owner's delete enqueues exactly the
// VolumeAttachments whose tickets it owns, found through the index.
func TestVolumeAttachmentEnqueue(t *testing.T) {
	v2 := adVolume(v1beta1.VolumeStateDetached, "", "")
	v2.Name, v2.UID = "v2", "v2-uid"
	v3 := adVolume(v1beta1.VolumeStateDetached, "", "")
	v3.Name, v3.UID = "v3", "v3-uid"
	va2 := adVA(ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-1", "s1"))
	va2.Name, va2.Spec.Volume = "v2", "v2"
	va3 := adVA(ownedBy(fixture.Ticket("csi-x", csi, "node-1"), "storage.k8s.io/v1", "VolumeAttachment", "", "csi-x", "x"))
	va3.Name, va3.Spec.Volume = "v3", "v3"
	// v4's ticket is owned by snap-3, whose delete is a marker on the
	// snapshot informer.
	v4 := adVolume(v1beta1.VolumeStateDetached, "", "")
	v4.Name, v4.UID = "v4", "v4-uid"
	va4 := adVA(ownedBy(fixture.Ticket("snap-3", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-3", "s3"))
	va4.Name, va4.Spec.Volume = "v4", "v4"
	env, c, _ := adEnv(t, []runtime.Object{adVolume(v1beta1.VolumeStateDetached, "", ""), v2, v3, v4, va2, va3, va4,
		adSnapshot("snap-1", "s1"), adSnapshot("snap-2", "s2"), adSnapshot("snap-3", "s3")},
		[]runtime.Object{adStorageVA("csi-x", "x")})

	drain := func() []string {
		var keys []string
		for c.Queue.Len() > 0 {
			k, _ := c.Queue.Get()
			c.Queue.Done(k)
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return keys
	}
	// drainThrough drains the queue until marker has come out and returns
	// every key drained. An informer hands events to a handler in order, so
	// once a marker change made after a step is enqueued, whatever the step
	// enqueued is in the queue too: a negative is proven by a positive that
	// must come after it, not by a sleep.
	drainThrough := func(marker string) []string {
		t.Helper()
		var keys []string
		require.Eventually(t, func() bool {
			keys = append(keys, drain()...)
			return slices.Contains(keys, marker)
		}, 5*time.Second, 10*time.Millisecond, "marker %s enqueued", marker)
		sort.Strings(keys)
		return keys
	}
	ctx := context.Background()
	vols := env.Strata.StrataV1beta1().Volumes(fixture.NS)
	markers := 0
	// newVolume is a marker on the volume informer: a new volume is enqueued.
	newVolume := func(t *testing.T) string {
		markers++
		v := adVolume(v1beta1.VolumeStateDetached, "", "")
		v.Name, v.UID = fmt.Sprintf("marker-%d", markers), k8stypes.UID(fmt.Sprintf("marker-%d-uid", markers))
		_, err := vols.Create(ctx, v, metav1.CreateOptions{})
		require.NoError(t, err)
		return fixture.NS + "/" + v.Name
	}

	// The handlers were added to running informers, which replay their
	// objects: a new object on each informer that enqueues comes after the
	// replay.
	va := adVA()
	va.Name, va.Spec.Volume = "marker-va", "marker-va"
	_, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Create(ctx, va, metav1.CreateOptions{})
	require.NoError(t, err)
	initial := drainThrough(fixture.NS + "/marker-va")
	initial = append(initial, drainThrough(newVolume(t))...)
	sort.Strings(initial)
	initial = slices.Compact(initial) // both informers' replays enqueue v1..v4
	assert.Equal(t, []string{fixture.NS + "/marker-1", fixture.NS + "/marker-va", fixture.NS + "/v1", fixture.NS + "/v2", fixture.NS + "/v3",
		fixture.NS + "/v4"}, initial)

	steps := []struct {
		name string
		do   func(t *testing.T)
		want []string
		// marker, for a step that must enqueue nothing: a later change on
		// the same informer that enqueues the key it returns.
		marker func(t *testing.T) string
	}{
		{"a volume status change the AD logic does not read", func(t *testing.T) {
			v, err := vols.Get(ctx, adVolName, metav1.GetOptions{})
			require.NoError(t, err)
			v.Status.ActualSize = 99
			_, err = vols.UpdateStatus(ctx, v, metav1.UpdateOptions{})
			require.NoError(t, err)
		}, nil, newVolume},
		{"a volume state change", func(t *testing.T) {
			v, err := vols.Get(ctx, adVolName, metav1.GetOptions{})
			require.NoError(t, err)
			v.Status.State = v1beta1.VolumeStateAttaching
			_, err = vols.UpdateStatus(ctx, v, metav1.UpdateOptions{})
			require.NoError(t, err)
		}, []string{fixture.NS + "/v1"}, nil},
		{"deleting a snapshot no ticket names", func(t *testing.T) {
			require.NoError(t, env.Strata.StrataV1beta1().Snapshots(fixture.NS).Delete(ctx, "snap-2", metav1.DeleteOptions{}))
		}, nil, func(t *testing.T) string {
			require.NoError(t, env.Strata.StrataV1beta1().Snapshots(fixture.NS).Delete(ctx, "snap-3", metav1.DeleteOptions{}))
			return fixture.NS + "/v4"
		}},
		{"deleting the snapshot a ticket names", func(t *testing.T) {
			require.NoError(t, env.Strata.StrataV1beta1().Snapshots(fixture.NS).Delete(ctx, "snap-1", metav1.DeleteOptions{}))
		}, []string{fixture.NS + "/v2"}, nil},
		{"deleting the Kubernetes VolumeAttachment a ticket names", func(t *testing.T) {
			require.NoError(t, env.Kube.StorageV1().VolumeAttachments().Delete(ctx, "csi-x", metav1.DeleteOptions{}))
		}, []string{fixture.NS + "/v3"}, nil},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			step.do(t)
			if step.marker != nil {
				marker := step.marker(t)
				assert.Equal(t, []string{marker}, drainThrough(marker), "nothing but the marker enqueued")
				return
			}
			require.Eventually(t, func() bool { return c.Queue.Len() == len(step.want) }, 5*time.Second, 10*time.Millisecond)
			assert.Equal(t, step.want, drain())
		})
	}
}

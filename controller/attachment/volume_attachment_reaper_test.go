package attachment

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestReaperOwnerVerdict(t *testing.T) {
	backup := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "bk-1", Namespace: fixture.NS, UID: "b-uid"}}
	clone := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "clone", Namespace: fixture.NS, UID: "c-uid"}}
	_, c, _ := adEnv(t, []runtime.Object{backup, clone, adSnapshot("snap-1", "s-uid")},
		[]runtime.Object{adStorageVA("csi-1", "k-uid"), apiLease("api-live", "l-uid", 0), apiLease("api-lapsed", "l2-uid", 2*time.Minute)})
	ref := func(apiVersion, kind, namespace, name, uid string) *v1beta1.TicketOwnerReference {
		return &v1beta1.TicketOwnerReference{APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name, UID: uid}
	}
	tests := []struct {
		name string
		ref  *v1beta1.TicketOwnerReference
		want ownerVerdict
	}{
		{"backup present", ref("strata.io/v1beta1", "Backup", fixture.NS, "bk-1", "b-uid"), ownerPresent},
		{"backup present, no UID in the reference", ref("strata.io/v1beta1", "Backup", "", "bk-1", ""), ownerPresent},
		{"backup gone", ref("strata.io/v1beta1", "Backup", fixture.NS, "bk-2", "x"), ownerGone},
		{"backup replaced", ref("strata.io/v1beta1", "Backup", fixture.NS, "bk-1", "older"), ownerGone},
		{"clone volume present", ref("strata.io/v1beta1", "Volume", fixture.NS, "clone", "c-uid"), ownerPresent},
		{"clone volume gone", ref("strata.io/v1beta1", "Volume", fixture.NS, "clone-2", "c2"), ownerGone},
		{"another API version of the same group counts", ref("strata.io/v1", "Snapshot", fixture.NS, "snap-1", "s-uid"), ownerPresent},
		{"kubernetes VolumeAttachment present (the namespace does not matter)",
			ref("storage.k8s.io/v1", "VolumeAttachment", "whatever", "csi-1", "k-uid"), ownerPresent},
		{"kubernetes VolumeAttachment gone", ref("storage.k8s.io/v1", "VolumeAttachment", "", "csi-2", "k2"), ownerGone},
		{"strata's own VolumeAttachment is not a watched owner kind",
			ref("strata.io/v1beta1", "VolumeAttachment", fixture.NS, "v1", "u"), ownerNotWatched},
		{"a kind of another group is not watched", ref("example.com/v1", "Snapshot", fixture.NS, "snap-1", "s-uid"), ownerNotWatched},
		{"an unparsable apiVersion is not watched", ref("a/b/c", "Snapshot", fixture.NS, "snap-1", "s-uid"), ownerNotWatched},
		{"an API client's Lease, renewed", ref("coordination.k8s.io/v1", "Lease", fixture.NS, "api-live", "l-uid"), ownerPresent},
		{"an API client's Lease, not renewed for longer than its duration",
			ref("coordination.k8s.io/v1", "Lease", fixture.NS, "api-lapsed", "l2-uid"), ownerGone},
		{"an API client's Lease, deleted", ref("coordination.k8s.io/v1", "Lease", fixture.NS, "api-gone", "l3-uid"), ownerGone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, detail, err := c.ticketOwnerVerdict(context.Background(), tc.ref)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			if got == ownerGone {
				assert.NotEmpty(t, detail)
			}
		})
	}
}

// apiLease is a REST API client's ticket Lease of 60 s, renewed ago.
func apiLease(name, uid string, ago time.Duration) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fixture.NS, UID: k8stypes.UID(uid),
		Labels: map[string]string{types.LabelComponent: types.ComponentAPITicket}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("alice"), LeaseDurationSeconds: new(int32(60)),
			RenewTime: &metav1.MicroTime{Time: dstest.Now.Add(-ago)}}}
}

func TestReaperKeepsTicketWhenTheAPIServerCannotTell(t *testing.T) {
	env, c, rec := adEnv(t, []runtime.Object{
		adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1"),
		adVA(ownedBy(fixture.Ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", fixture.NS, "snap-1", "s-uid")),
	}, nil)
	fixture.ReactorError{Verb: "get", Resource: "snapshots", Err: errors.New("apiserver unavailable")}.Install(env.Strata)

	err := c.syncVolumeAttachment(context.Background(), fixture.NS+"/"+adVolName)
	require.ErrorContains(t, err, "apiserver unavailable")
	assert.Empty(t, fixture.Writes(env.Strata.Actions()), "nothing is removed on a guess")
	fixture.AssertEvents(t, nil, rec)
}

func TestReaperMarkUnwatchedOwners(t *testing.T) {
	now := metav1.NewTime(dstest.Now)
	statuses := map[string]*v1beta1.AttachmentTicketStatus{
		"a": {ID: "a", Conditions: []metav1.Condition{{Type: v1beta1.AttachmentStatusConditionTypeSatisfied, Status: metav1.ConditionTrue}}},
		"b": {ID: "b", Conditions: []metav1.Condition{
			{Type: v1beta1.AttachmentStatusConditionTypeSatisfied, Status: metav1.ConditionTrue},
			{Type: TicketConditionTypeOwnerWatched, Status: metav1.ConditionFalse, Reason: TicketReasonOwnerKindNotWatched},
		}},
	}
	markUnwatchedOwners(statuses, map[string]string{"a": "Widget.example.com"}, now)
	assert.Len(t, statuses["a"].Conditions, 2, "a gets the condition")
	assert.Equal(t, TicketReasonOwnerKindNotWatched, statuses["a"].Conditions[1].Reason)
	assert.Len(t, statuses["b"].Conditions, 1, "b's owner is watched now: the condition goes")
	assert.Equal(t, v1beta1.AttachmentStatusConditionTypeSatisfied, statuses["b"].Conditions[0].Type)
}

// A REST API client's ticket whose Lease lapsed (the client vanished) is
// removed, its Lease with it; a renewed one's ticket stays.
func TestReaperRemovesTicketsOfLapsedAPILeases(t *testing.T) {
	env, c, rec := adEnv(t, []runtime.Object{
		adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1"),
		adVA(ownedBy(fixture.Ticket("api-gone", v1beta1.AttacherTypeStrataAPI, "node-1"), "coordination.k8s.io/v1", "Lease", fixture.NS, "api-lapsed", "l2-uid"),
			ownedBy(fixture.Ticket("api-here", v1beta1.AttacherTypeStrataAPI, "node-1"), "coordination.k8s.io/v1", "Lease", fixture.NS, "api-live", "l-uid")),
	}, []runtime.Object{apiLease("api-live", "l-uid", 30*time.Second), apiLease("api-lapsed", "l2-uid", 61*time.Second)})
	env.ClearActions()

	require.NoError(t, c.syncVolumeAttachment(context.Background(), fixture.NS+"/"+adVolName))
	va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), adVolName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, va.Spec.AttachmentTickets, "api-here")
	assert.NotContains(t, va.Spec.AttachmentTickets, "api-gone")
	assert.Equal(t, []string{"delete leases api-lapsed"}, fixture.Writes(env.Kube.Actions()), "the lapsed Lease goes with its ticket")
	assert.Contains(t, fixture.DrainEvents(rec), "Normal "+EventReasonADTicketRemoved)
}

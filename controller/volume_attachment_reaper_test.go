package controller

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func TestReaperOwnerVerdict(t *testing.T) {
	backup := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "bk-1", Namespace: testNS, UID: "b-uid"}}
	clone := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: "clone", Namespace: testNS, UID: "c-uid"}}
	_, c, _ := adEnv(t, []runtime.Object{backup, clone, adSnapshot("snap-1", "s-uid")},
		[]runtime.Object{adStorageVA("csi-1", "k-uid")})
	ref := func(apiVersion, kind, namespace, name, uid string) *v1beta1.TicketOwnerReference {
		return &v1beta1.TicketOwnerReference{APIVersion: apiVersion, Kind: kind, Namespace: namespace, Name: name, UID: uid}
	}
	tests := []struct {
		name string
		ref  *v1beta1.TicketOwnerReference
		want ownerVerdict
	}{
		{"backup present", ref("strata.io/v1beta1", "Backup", testNS, "bk-1", "b-uid"), ownerPresent},
		{"backup present, no UID in the reference", ref("strata.io/v1beta1", "Backup", "", "bk-1", ""), ownerPresent},
		{"backup gone", ref("strata.io/v1beta1", "Backup", testNS, "bk-2", "x"), ownerGone},
		{"backup replaced", ref("strata.io/v1beta1", "Backup", testNS, "bk-1", "older"), ownerGone},
		{"clone volume present", ref("strata.io/v1beta1", "Volume", testNS, "clone", "c-uid"), ownerPresent},
		{"clone volume gone", ref("strata.io/v1beta1", "Volume", testNS, "clone-2", "c2"), ownerGone},
		{"another API version of the same group counts", ref("strata.io/v1", "Snapshot", testNS, "snap-1", "s-uid"), ownerPresent},
		{"kubernetes VolumeAttachment present (the namespace does not matter)",
			ref("storage.k8s.io/v1", "VolumeAttachment", "whatever", "csi-1", "k-uid"), ownerPresent},
		{"kubernetes VolumeAttachment gone", ref("storage.k8s.io/v1", "VolumeAttachment", "", "csi-2", "k2"), ownerGone},
		{"strata's own VolumeAttachment is not a watched owner kind",
			ref("strata.io/v1beta1", "VolumeAttachment", testNS, "v1", "u"), ownerNotWatched},
		{"a kind of another group is not watched", ref("example.com/v1", "Snapshot", testNS, "snap-1", "s-uid"), ownerNotWatched},
		{"an unparsable apiVersion is not watched", ref("a/b/c", "Snapshot", testNS, "snap-1", "s-uid"), ownerNotWatched},
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

func TestReaperKeepsTicketWhenTheAPIServerCannotTell(t *testing.T) {
	env, c, rec := adEnv(t, []runtime.Object{
		adVolume(v1beta1.VolumeStateAttached, "node-1", "node-1"),
		adVA(ownedBy(ticket("snap-1", snapCtl, "node-1"), "strata.io/v1beta1", "Snapshot", testNS, "snap-1", "s-uid")),
	}, nil)
	reactorError{"get", "snapshots", "", errors.New("apiserver unavailable")}.install(env.Strata)

	err := c.syncVolumeAttachment(context.Background(), testNS+"/"+adVolName)
	require.ErrorContains(t, err, "apiserver unavailable")
	assert.Empty(t, writes(env.Strata.Actions()), "nothing is removed on a guess")
	assertEvents(t, nil, rec)
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

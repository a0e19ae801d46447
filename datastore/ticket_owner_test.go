package datastore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func vaWithOwners(name string, owners ...*v1beta1.TicketOwnerReference) *v1beta1.VolumeAttachment {
	va := &v1beta1.VolumeAttachment{ObjectMeta: meta(name), Spec: v1beta1.VolumeAttachmentSpec{Volume: name,
		AttachmentTickets: map[string]*v1beta1.AttachmentTicket{"plain": {ID: "plain", NodeID: "node-1"}}}}
	for i, o := range owners {
		id := string(rune('a' + i))
		va.Spec.AttachmentTickets[id] = &v1beta1.AttachmentTicket{ID: id, NodeID: "node-1", OwnerRef: o}
	}
	return va
}

func TestTicketOwnerIndex(t *testing.T) {
	snap1 := &v1beta1.TicketOwnerReference{APIVersion: "strata.io/v1beta1", Kind: "Snapshot", Namespace: ns, Name: "snap-1", UID: "u"}
	kubeVA := &v1beta1.TicketOwnerReference{APIVersion: "storage.k8s.io/v1", Kind: "VolumeAttachment", Name: "csi-1"}
	env := dstest.New(t, []runtime.Object{
		vaWithOwners("v1", snap1, kubeVA),
		vaWithOwners("v2", snap1, snap1), // two tickets of one owner: indexed once
		vaWithOwners("v3"),
	}, []runtime.Object{&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-1"}}})
	ds := env.DS

	tests := []struct {
		name string
		key  string
		want []string
	}{
		{"snapshot", datastore.TicketOwnerKey(v1beta1.SchemeGroupVersion.WithKind("Snapshot").GroupKind(), ns, "snap-1"),
			[]string{"v1", "v2"}},
		{"kubernetes volume attachment (cluster-scoped)",
			datastore.TicketOwnerKey(schema.GroupKind{Group: "storage.k8s.io", Kind: "VolumeAttachment"}, "", "csi-1"), []string{"v1"}},
		{"strata's own kind of the same name is another key",
			datastore.TicketOwnerKey(schema.GroupKind{Group: "strata.io", Kind: "VolumeAttachment"}, "", "csi-1"), []string{}},
		{"no owner", datastore.TicketOwnerKey(schema.GroupKind{Group: "strata.io", Kind: "Snapshot"}, ns, "snap-2"), []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ds.VolumeAttachments.ListByIndexRO(datastore.IndexByTicketOwner, tc.key)
			require.NoError(t, err)
			assert.Equal(t, tc.want, names(got))
		})
	}
	assert.Equal(t, "Snapshot.strata.io/"+ns+"/snap-1", datastore.TicketOwnerRefKey(snap1))
	assert.Equal(t, "VolumeAttachment.storage.k8s.io//csi-1", datastore.TicketOwnerRefKey(kubeVA))

	got, err := ds.StorageVolumeAttachments.GetRO("csi-1")
	require.NoError(t, err, "Kubernetes VolumeAttachments are cached, cluster-scoped")
	assert.Equal(t, "csi-1", got.Name)
	_, err = ds.StorageVolumeAttachments.GetRO("csi-2")
	assert.True(t, apierrors.IsNotFound(err))
}

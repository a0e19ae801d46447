package csi

import (
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func strataNode(name string) *v1beta1.Node {
	return &v1beta1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace}}
}

func strataVA(volume string) *v1beta1.VolumeAttachment {
	return &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: volume, Namespace: types.DefaultNamespace}}
}

// kubeAttachment is what Kubernetes has for a PVC's volume used on a node:
// the PV, the storage VolumeAttachment, and the Node labelled by the kubelet
// with the Strata node.
func kubeAttachment(volume, k8sNode, strataNodeName string) []runtime.Object {
	pv := "pv-" + volume
	return []runtime.Object{
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: DriverName, VolumeHandle: volume}}}},
		&storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-abc", UID: "uid-1"}, Spec: storagev1.VolumeAttachmentSpec{
			Attacher: DriverName, NodeName: k8sNode, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pv)}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k8sNode, Labels: map[string]string{TopologyNodeKey: strataNodeName}}},
	}
}

func TestControllerPublishVolume(t *testing.T) {
	attached := func(e *dstest.Env) {
		// The VolumeAttachment controller's part: the ticket is satisfied.
		e.Strata.PrependReactor("update", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
			va := a.(k8stesting.UpdateAction).GetObject().(*v1beta1.VolumeAttachment)
			va.Status.AttachmentTicketStatuses = map[string]*v1beta1.AttachmentTicketStatus{}
			for id := range va.Spec.AttachmentTickets {
				va.Status.AttachmentTicketStatuses[id] = &v1beta1.AttachmentTicketStatus{ID: id, Satisfied: true}
			}
			return false, nil, nil
		})
	}
	vol := existingVolume("pvc-1", 1<<20, 1)
	vol.Status.FrontendEndpoint = "nbd+unix:///pvc-1?socket=/var/lib/strata/im-nbd/nbd.sock"
	tests := []struct {
		name      string
		strata    []runtime.Object
		kube      []runtime.Object
		react     func(*dstest.Env)
		req       *csi.ControllerPublishVolumeRequest
		wantCode  codes.Code
		wantMsg   string
		wantOwner string
	}{
		{name: "owned by Kubernetes' VolumeAttachment", strata: []runtime.Object{vol, strataNode("node-2"), strataVA("pvc-1")},
			kube: kubeAttachment("pvc-1", "127.0.0.2", "node-2"), react: attached,
			req: &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-2", VolumeCapability: rwo}, wantOwner: "csi-abc"},
		{name: "no Kubernetes attachment (csi-sanity): no owner", strata: []runtime.Object{vol, strataNode("node-2"), strataVA("pvc-1")},
			kube: kubeAttachment("pvc-1", "127.0.0.3", "node-3"), react: attached,
			req: &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-2", VolumeCapability: rwo}},
		{name: "not attached in time: the ticket's reason", strata: []runtime.Object{vol, strataNode("node-2"), strataVA("pvc-1")},
			req:      &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-2", VolumeCapability: rwo},
			wantCode: codes.DeadlineExceeded, wantMsg: "ticket csi-node-2 not satisfied: the ticket has no status yet"},
		{name: "unknown volume", strata: []runtime.Object{strataNode("node-2")},
			req: &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-2", VolumeCapability: rwo}, wantCode: codes.NotFound},
		{name: "unknown node", strata: []runtime.Object{vol},
			req: &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-9", VolumeCapability: rwo}, wantCode: codes.NotFound, wantMsg: "node node-9"},
		{name: "no node id", req: &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", VolumeCapability: rwo},
			wantCode: codes.InvalidArgument, wantMsg: "node_id: required"},
		{name: "no capability", req: &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-2"},
			wantCode: codes.InvalidArgument, wantMsg: "volume_capability: required"},
	}
	defer func(old time.Duration) { publishWait = old }(publishWait)
	publishWait = time.Second
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, env := controllerDriver(t, tc.strata, tc.kube, tc.react)
			resp, err := d.ControllerPublishVolume(t.Context(), tc.req)
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			assert.Equal(t, vol.Status.FrontendEndpoint, resp.PublishContext[PublishContextEndpoint])
			va, err := env.Strata.StrataV1beta1().VolumeAttachments(types.DefaultNamespace).Get(t.Context(), "pvc-1", metav1.GetOptions{})
			require.NoError(t, err)
			ticket := va.Spec.AttachmentTickets["csi-node-2"]
			require.NotNil(t, ticket)
			assert.Equal(t, v1beta1.AttacherTypeCSIAttacher, ticket.Type)
			if tc.wantOwner == "" {
				assert.Nil(t, ticket.OwnerRef)
			} else {
				require.NotNil(t, ticket.OwnerRef)
				assert.Equal(t, tc.wantOwner, ticket.OwnerRef.Name)
				assert.Equal(t, "VolumeAttachment", ticket.OwnerRef.Kind)
			}
		})
	}
}

func TestControllerUnpublishVolume(t *testing.T) {
	va := strataVA("pvc-1")
	va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{
		"csi-node-2": {ID: "csi-node-2", Type: v1beta1.AttacherTypeCSIAttacher, NodeID: "node-2"},
		"snap-1":     {ID: "snap-1", Type: v1beta1.AttacherTypeSnapshotController, NodeID: "node-3"},
	}
	env := dstest.New(t, []runtime.Object{existingVolume("pvc-1", 1<<20, 1), va}, nil)
	d, err := NewDriver(Options{Mode: ModeController, Version: "test", Store: env.DS})
	require.NoError(t, err)

	_, err = d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: "pvc-1", NodeId: "node-2"})
	require.NoError(t, err)
	got, err := env.Strata.StrataV1beta1().VolumeAttachments(types.DefaultNamespace).Get(t.Context(), "pvc-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, got.Spec.AttachmentTickets, "csi-node-2", "the node's CSI ticket goes")
	assert.Contains(t, got.Spec.AttachmentTickets, "snap-1", "other tickets stay")

	_, err = d.ControllerUnpublishVolume(t.Context(), &csi.ControllerUnpublishVolumeRequest{VolumeId: "gone", NodeId: "node-2"})
	assert.NoError(t, err, "a volume that is gone is unpublished")
}

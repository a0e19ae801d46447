package csi

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// PublishContextEndpoint carries the volume's NBD endpoint to the node
// plugin, which connects it to a block device.
const PublishContextEndpoint = "strata.io/endpoint"

// publishWait bounds how long ControllerPublish and Unpublish wait for the
// attachment to happen; the external-attacher retries after a failure, and
// the calls are idempotent.
var publishWait = 2 * time.Minute

// ControllerPublishVolume attaches the volume to the node through a
// csi-attacher ticket owned by Kubernetes' VolumeAttachment, so the ticket
// goes with it even if the matching unpublish never comes.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	volume, node := req.GetVolumeId(), req.GetNodeId()
	if err := requireIDs(volume, node); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume_capability: required")
	}
	if err := checkCapabilities([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	if _, err := d.ds.Volumes.GetROOrLive(ctx, volume); err != nil {
		return nil, apiStatus(err, "volume "+volume)
	}
	if _, err := d.ds.Nodes.GetROOrLive(ctx, node); err != nil {
		return nil, apiStatus(err, "node "+node)
	}
	ticket := &v1beta1.AttachmentTicket{ID: csiTicketID(node), Type: v1beta1.AttacherTypeCSIAttacher, NodeID: node,
		Parameters: map[string]string{v1beta1.AttachmentParameterDisableFrontend: v1beta1.FalseValue},
		OwnerRef:   d.storageAttachmentOf(volume, node)}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error { return d.ds.EnsureTicket(ctx, volume, ticket) }); err != nil {
		return nil, apiStatus(err, fmt.Sprintf("adding ticket %s to volume %s", ticket.ID, volume))
	}
	vol, err := d.waitAttached(ctx, volume, ticket.ID)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		PublishContextEndpoint: vol.Status.FrontendEndpoint}}, nil
}

// ControllerUnpublishVolume removes the node's csi-attacher ticket and waits
// until the volume has left the node (unless another ticket keeps it there).
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	volume, node := req.GetVolumeId(), req.GetNodeId()
	if volume == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: required")
	}
	va, err := d.ds.VolumeAttachments.GetROOrLive(ctx, volume)
	if apierrors.IsNotFound(err) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil // the volume is gone, and with it every ticket
	}
	if err != nil {
		return nil, apiStatus(err, "volume attachment "+volume)
	}
	// An empty node id means every node.
	stillWanted := false // another kind of ticket keeps the volume on the node
	for id, t := range va.Spec.AttachmentTickets {
		if node != "" && t.NodeID != node {
			continue
		}
		if t.Type != v1beta1.AttacherTypeCSIAttacher {
			stillWanted = true
			continue
		}
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error { return d.ds.RemoveTicket(ctx, volume, id) }); err != nil {
			return nil, apiStatus(err, fmt.Sprintf("removing ticket %s from volume %s", id, volume))
		}
	}
	if node == "" || stillWanted {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, publishWait, true, func(context.Context) (bool, error) {
		v, err := d.ds.Volumes.GetRO(volume)
		return apierrors.IsNotFound(err) || (err == nil && v.Status.CurrentNodeID != node), nil
	})
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "volume %s: still attached to %s; retry", volume, node)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// csiTicketID is one ticket per node: the attacher publishes a volume to a
// node once, and the same id makes a repeated publish a no-op.
func csiTicketID(node string) string { return "csi-" + node }

// storageAttachmentOf finds Kubernetes' VolumeAttachment for the volume on
// the node, to own the ticket. csi-sanity and hand-made calls have none; the
// ticket then has no owner and lives until unpublished.
func (d *Driver) storageAttachmentOf(volume, node string) *v1beta1.TicketOwnerReference {
	vas, err := d.ds.StorageVolumeAttachments.ListRO(labels.Everything())
	if err != nil {
		return nil
	}
	for _, va := range vas {
		if va.Spec.Attacher != DriverName || va.Spec.Source.PersistentVolumeName == nil || va.DeletionTimestamp != nil {
			continue
		}
		pv, err := d.ds.PersistentVolumes.Get(*va.Spec.Source.PersistentVolumeName)
		if err != nil || pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != volume {
			continue
		}
		if k8sNode, err := d.ds.KubeNodes.Get(va.Spec.NodeName); err != nil || k8sNode.Labels[TopologyNodeKey] != node {
			continue
		}
		return ownerRef(va)
	}
	return nil
}

func ownerRef(va *storagev1.VolumeAttachment) *v1beta1.TicketOwnerReference {
	return &v1beta1.TicketOwnerReference{APIVersion: storagev1.SchemeGroupVersion.String(), Kind: "VolumeAttachment",
		Name: va.Name, UID: string(va.UID)}
}

// waitAttached waits for the ticket to be satisfied; on time-out the
// ticket's own condition says why not.
func (d *Driver) waitAttached(ctx context.Context, volume, id string) (*v1beta1.Volume, error) {
	var reason string
	var vol *v1beta1.Volume
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, publishWait, true, func(context.Context) (bool, error) {
		va, err := d.ds.VolumeAttachments.GetRO(volume)
		if err != nil {
			return false, nil
		}
		st := va.Status.AttachmentTicketStatuses[id]
		if st == nil {
			reason = "the ticket has no status yet"
			return false, nil
		}
		if c := findCondition(st.Conditions, v1beta1.AttachmentStatusConditionTypeSatisfied); c != nil && c.Message != "" {
			reason = c.Message
		}
		if !st.Satisfied {
			return false, nil
		}
		v, err := d.ds.Volumes.GetRO(volume)
		if err != nil || v.Status.FrontendEndpoint == "" {
			reason = "attached, no frontend endpoint yet"
			return false, nil
		}
		vol = v
		return true, nil
	})
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "volume %s: ticket %s not satisfied: %s; retry", volume, id, reason)
	}
	return vol, nil
}

func requireIDs(volume, node string) error {
	if volume == "" {
		return status.Error(codes.InvalidArgument, "volume_id: required")
	}
	if node == "" {
		return status.Error(codes.InvalidArgument, "node_id: required")
	}
	return nil
}

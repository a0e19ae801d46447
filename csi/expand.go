package csi

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	mountutils "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// expandWait bounds how long ControllerExpandVolume waits for the replicas
// to grow; the external-resizer retries a DeadlineExceeded.
var expandWait = 60 * time.Second

// ControllerExpandVolume grows the volume's spec.size and waits until the
// replicas have the new size: an attached volume's engine grows them while
// it serves (online), a detached volume's replicas are opened at the new
// size. Every volume then needs the node's part: the device on the node
// (and the filesystem on it) grow in NodeExpandVolume, or at the next stage.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: required")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity_range: required")
	}
	size, err := volumeSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	if err := d.growSpec(ctx, id, size); err != nil {
		return nil, err
	}
	var vol *v1beta1.Volume
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, expandWait, true, func(context.Context) (bool, error) {
		v, err := d.ds.Volumes.GetRO(id)
		if err != nil {
			return false, nil
		}
		vol = v
		return v.Status.CurrentSize >= size, nil
	})
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "volume %s: the replicas have %d bytes of the %d asked within %s (state %q); retry",
			id, currentSize(vol), size, expandWait, stateOf(vol))
	}
	d.log.WithFields(map[string]any{"volume": id, "size": vol.Status.CurrentSize, "state": vol.Status.State}).Info("Expanded volume")
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: vol.Status.CurrentSize, NodeExpansionRequired: true}, nil
}

// growSpec raises spec.size to size unless it is already as large; the
// webhook refuses a shrink and names the reason.
func (d *Driver) growSpec(ctx context.Context, id string, size int64) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vol, err := d.ds.Volumes.GetLive(ctx, id)
		if err != nil {
			return err
		}
		if vol.DeletionTimestamp != nil {
			return status.Errorf(codes.NotFound, "volume %s is being deleted", id)
		}
		if vol.Spec.Size.Value() >= size {
			return nil
		}
		vol = vol.DeepCopy()
		vol.Spec.Size = *resource.NewQuantity(size, resource.BinarySI)
		_, err = d.ds.Volumes.Update(ctx, vol)
		return err
	})
	if _, isStatus := status.FromError(err); err == nil || isStatus {
		return err
	}
	return apiStatus(err, fmt.Sprintf("growing volume %s to %d bytes", id, size))
}

func currentSize(v *v1beta1.Volume) int64 {
	if v == nil {
		return 0
	}
	return v.Status.CurrentSize
}

// NodeExpandVolume grows the volume's device on this node to the engine's
// size now and, in mount mode, the filesystem on it while it stays mounted
// (resize2fs / xfs_growfs through mount-utils).
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	volume, path := req.GetVolumeId(), req.GetVolumePath()
	if volume == "" || path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and volume_path: required")
	}
	if _, ok, err := d.node.connector.Device(volume); err != nil || !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged on this node (%v)", volume, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume_path %s: %v", path, err)
	}
	size, err := d.node.connector.Resize(ctx, volume)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: growing the device: %v", volume, err)
	}
	// A block volume is published as the device node itself (the CO may
	// leave volume_capability out): nothing more to grow.
	if req.GetVolumeCapability().GetBlock() != nil || !fi.IsDir() {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	device, _, err := mountutils.GetDeviceNameFromMount(d.node.mounter, path)
	if err != nil || device == "" {
		return nil, status.Errorf(codes.NotFound, "volume_path %s: no filesystem of volume %s mounted there (%v)", path, volume, err)
	}
	if _, err := mountutils.NewResizeFs(utilexec.New()).Resize(device, path); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: growing the filesystem on %s at %s: %v", volume, device, path, err)
	}
	d.log.WithFields(map[string]any{"volume": volume, "device": device, "path": path, "size": size}).Info("Expanded volume on the node")
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

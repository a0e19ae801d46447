package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mountutils "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/strata-storage/strata/csi/nbddev"
)

// The node service: stage connects the volume's NBD export to a block
// device (csi/nbddev) and, in mount mode, formats it if blank and mounts it
// at the staging path; publish bind-mounts the staged filesystem (or the
// device itself, in block mode) at the Pod's target path. Every call is
// idempotent and judges from the mount table and the connector's system
// state, never from memory, so a plugin killed -9 picks up where it was.

// nodeService is what the node calls need besides the Driver.
type nodeService struct {
	connector nbddev.Connector
	mounter   *mountutils.SafeFormatAndMount
}

func newNodeService(connector nbddev.Connector) *nodeService {
	return &nodeService{connector: connector,
		mounter: mountutils.NewSafeFormatAndMount(mountutils.NewWithoutSystemd(""), utilexec.New())}
}

// defaultFsType is used when the capability names none.
const defaultFsType = "ext4"

// NodeGetInfo names the Strata node: the kubelet records it in CSINode and
// the external-attacher passes it back as ControllerPublish's node id.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.opts.NodeID,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyNodeKey: d.opts.NodeID}},
	}, nil
}

func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	volume, staging, capability := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	if err := requireNodeArgs(volume, staging, "staging_target_path", capability); err != nil {
		return nil, err
	}
	endpoint := req.GetPublishContext()[PublishContextEndpoint]
	if endpoint == "" {
		return nil, status.Errorf(codes.InvalidArgument, "publish_context: no %s (was the volume published to this node?)", PublishContextEndpoint)
	}
	device, err := d.node.connector.Connect(ctx, volume, endpoint)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: connecting %s: %v", volume, endpoint, err)
	}
	if capability.GetBlock() != nil {
		return &csi.NodeStageVolumeResponse{}, nil // publish binds the device itself
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "staging_target_path %s: %v", staging, err)
	}
	if mounted, err := d.mountedFrom(staging, device); err != nil || mounted {
		return &csi.NodeStageVolumeResponse{}, err
	}
	fsType := capability.GetMount().GetFsType()
	if fsType == "" {
		fsType = defaultFsType
	}
	if grown, err := growExtBeforeMount(ctx, device); err != nil {
		// The data is intact at its old size: mount it anyway.
		d.log.WithError(err).WithField("volume", volume).Warn("The filesystem is smaller than the volume and could not grow")
	} else if grown {
		d.log.WithFields(map[string]any{"volume": volume, "device": device}).Info("Grew the filesystem to the volume's size before mounting")
	}
	if err := d.node.mounter.FormatAndMount(device, staging, fsType, mountOptions(fsType, capability.GetMount().GetMountFlags())); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: formatting (if blank) and mounting %s at %s as %s: %v",
			volume, device, staging, fsType, err)
	}
	d.log.WithFields(map[string]any{"volume": volume, "device": device, "staging": staging, "fsType": fsType}).Info("Staged volume")
	d.growStagedFilesystem(volume, device, staging)
	return &csi.NodeStageVolumeResponse{}, nil
}

// mountOptions are the user's mount flags, plus nouuid for xfs: a claim
// restored or cloned from another holds a copy of its filesystem, UUID
// included, and the kernel refuses to mount an xfs whose UUID a mounted
// one already has (the source, or another restore, on the same node).
func mountOptions(fsType string, flags []string) []string {
	if fsType != "xfs" || slices.Contains(flags, "nouuid") {
		return flags
	}
	return append(slices.Clone(flags), "nouuid")
}

// growStagedFilesystem grows a filesystem smaller than its device: the
// volume was expanded while it was not staged here, or an earlier
// NodeExpandVolume could not grow it online. A failure leaves the volume
// usable at its old size, so it is logged rather than failing the stage.
func (d *Driver) growStagedFilesystem(volume, device, staging string) {
	resizer := mountutils.NewResizeFs(utilexec.New())
	need, err := resizer.NeedResize(device, staging)
	if err != nil || !need {
		return
	}
	if _, err := resizer.Resize(device, staging); err != nil {
		d.log.WithError(err).WithField("volume", volume).Warn("The filesystem is smaller than the volume and could not grow")
		return
	}
	d.log.WithFields(map[string]any{"volume": volume, "device": device}).Info("Grew the filesystem to the volume's size")
}

// mountedFrom reports whether path is a mount point; one of another device
// is an error (something else is staged there).
func (d *Driver) mountedFrom(path, device string) (bool, error) {
	notMnt, err := mountutils.IsNotMountPoint(d.node.mounter, path)
	if err != nil || notMnt {
		return false, err
	}
	refs, err := d.node.mounter.GetMountRefs(path)
	if err != nil {
		return false, status.Errorf(codes.Internal, "%s: reading the mount table: %v", path, err)
	}
	src, _, err := mountutils.GetDeviceNameFromMount(d.node.mounter, path)
	if err == nil && src != device && src != "" {
		return false, status.Errorf(codes.AlreadyExists, "%s: already mounted from %s, not %s (other mounts: %v)", path, src, device, refs)
	}
	return true, nil
}

func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	volume, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if volume == "" || staging == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and staging_target_path: required")
	}
	if d.opts.Freezer != nil {
		// An unmount waits for a frozen filesystem: end the freeze first.
		if err := d.opts.Freezer.ThawVolume(volume); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: thawing its filesystem: %v", volume, err)
		}
	}
	if err := mountutils.CleanupMountPoint(staging, d.node.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: unmounting %s: %v", volume, staging, err)
	}
	if err := d.node.connector.Disconnect(ctx, volume); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: disconnecting: %v", volume, err)
	}
	d.log.WithFields(map[string]any{"volume": volume, "staging": staging}).Info("Unstaged volume")
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	volume, target, capability := req.GetVolumeId(), req.GetTargetPath(), req.GetVolumeCapability()
	if err := requireNodeArgs(volume, target, "target_path", capability); err != nil {
		return nil, err
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.FailedPrecondition, "staging_target_path: required (the volume is staged first)")
	}
	options := []string{"bind"}
	if req.GetReadonly() {
		options = append(options, "ro")
	}
	source := req.GetStagingTargetPath()
	if capability.GetBlock() != nil {
		device, ok, err := d.node.connector.Device(volume)
		if err != nil || !ok {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s: not staged on this node (%v)", volume, err)
		}
		source = device
		if err := makeFile(target); err != nil {
			return nil, status.Errorf(codes.Internal, "target_path %s: %v", target, err)
		}
	} else {
		if notMnt, err := mountutils.IsNotMountPoint(d.node.mounter, source); err != nil || notMnt {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s: staging path %s is not mounted (%v)", volume, source, err)
		}
		if err := os.MkdirAll(target, 0o750); err != nil {
			return nil, status.Errorf(codes.Internal, "target_path %s: %v", target, err)
		}
		options = append(options, capability.GetMount().GetMountFlags()...)
	}
	if notMnt, err := mountutils.IsNotMountPoint(d.node.mounter, target); err == nil && !notMnt {
		return &csi.NodePublishVolumeResponse{}, nil // published already
	}
	if err := d.node.mounter.Mount(source, target, "", options); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: bind-mounting %s at %s: %v", volume, source, target, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and target_path: required")
	}
	if err := mountutils.CleanupMountPoint(req.GetTargetPath(), d.node.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: unmounting %s: %v", req.GetVolumeId(), req.GetTargetPath(), err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports space and inodes of a mounted volume, the size
// of a block one.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	volume, path := req.GetVolumeId(), req.GetVolumePath()
	if volume == "" || path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and volume_path: required")
	}
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.NotFound, "volume_path %s: not found", path)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume_path %s: %v", path, err)
	}
	if !fi.IsDir() { // a published block device
		size, err := blockDeviceSize(path)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume_path %s: %v", path, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, status.Errorf(codes.Internal, "volume_path %s: statfs: %v", path, err)
	}
	bs := int64(st.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs,
			Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

func blockDeviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil {
		return 0, fmt.Errorf("size: %w", err)
	}
	return size, nil
}

func requireNodeArgs(volume, path, pathField string, capability *csi.VolumeCapability) error {
	switch {
	case volume == "":
		return status.Error(codes.InvalidArgument, "volume_id: required")
	case path == "":
		return status.Errorf(codes.InvalidArgument, "%s: required", pathField)
	case capability == nil:
		return status.Error(codes.InvalidArgument, "volume_capability: required")
	}
	return checkCapabilities([]*csi.VolumeCapability{capability})
}

// makeFile creates the file a block device is bind-mounted on.
func makeFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

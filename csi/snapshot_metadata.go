package csi

import (
	"context"
	"errors"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/strata-storage/strata/engineapi"
)

// The CSI SnapshotMetadata service (changed-block tracking for backup
// tools, through the external-snapshot-metadata sidecar): which blocks a
// snapshot holds, and which changed between two snapshots of a volume.
// The answers come from the volume's engine through a manager (the REST
// API's snapshotBlocks: the plugin holds no data-plane credentials), page
// by page, and go out as the stream's messages as they come.

// BlocksPage is one page of a snapshot's extents.
type BlocksPage struct {
	VolumeSize int64
	Extents    []engineapi.BlockExtent
	// Next is where the following page starts; nil on the last page.
	Next *int64
}

// BlocksSource opens a reader for one stream's pages: what it costs to
// reach the source (a TLS handshake, the CA read) is paid once a stream.
type BlocksSource interface {
	OpenBlocks(ctx context.Context) (BlocksReader, error)
}

// BlocksReader reads pages of a snapshot's blocks of volume, or with base
// those written since base; at most maxResults extents a page.
type BlocksReader interface {
	SnapshotBlocks(ctx context.Context, volume, snapshot, base string, startingOffset int64, maxResults int) (BlocksPage, error)
	Close()
}

// Errors a BlocksSource returns for the caller's mistakes.
var (
	ErrBlocksNotFound = errors.New("not found")
	ErrBlocksInvalid  = errors.New("invalid")
	// ErrBlocksRefused: the source will not answer this plugin (its
	// rights, say); asking again would not help.
	ErrBlocksRefused = errors.New("refused")
)

// defaultMetadataResults is the extents per message when the caller does
// not bound them.
const defaultMetadataResults = 1000

func (d *Driver) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	if req.GetSnapshotId() == "" {
		return status.Error(codes.InvalidArgument, "snapshot_id: missing")
	}
	return d.streamBlocks(stream.Context(), req.GetSnapshotId(), "", req.GetStartingOffset(), req.GetMaxResults(),
		func(size int64, blocks []*csi.BlockMetadata) error {
			return stream.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
				VolumeCapacityBytes: size, BlockMetadata: blocks})
		})
}

func (d *Driver) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	switch {
	case req.GetTargetSnapshotId() == "":
		return status.Error(codes.InvalidArgument, "target_snapshot_id: missing")
	case req.GetBaseSnapshotId() == "":
		return status.Error(codes.InvalidArgument, "base_snapshot_id: missing")
	}
	return d.streamBlocks(stream.Context(), req.GetTargetSnapshotId(), req.GetBaseSnapshotId(), req.GetStartingOffset(),
		req.GetMaxResults(), func(size int64, blocks []*csi.BlockMetadata) error {
			return stream.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
				VolumeCapacityBytes: size, BlockMetadata: blocks})
		})
}

// streamBlocks sends the snapshot's blocks (or, with base, the delta)
// from startingOffset on, at most maxResults a message.
func (d *Driver) streamBlocks(ctx context.Context, snapshot, base string, startingOffset int64, maxResults int32,
	send func(size int64, blocks []*csi.BlockMetadata) error) error {
	switch {
	case d.opts.Blocks == nil:
		return status.Error(codes.Unimplemented, "this plugin serves no snapshot metadata")
	case startingOffset < 0:
		return status.Errorf(codes.InvalidArgument, "starting_offset: %d is negative", startingOffset)
	case maxResults < 0:
		return status.Errorf(codes.InvalidArgument, "max_results: %d is negative", maxResults)
	}
	if maxResults == 0 {
		maxResults = defaultMetadataResults
	}
	volume, err := d.snapshotVolume("snapshot", snapshot)
	if err != nil {
		return err
	}
	if base != "" {
		baseVolume, err := d.snapshotVolume("base_snapshot_id", base)
		if err != nil {
			return err
		}
		if baseVolume != volume {
			return status.Errorf(codes.InvalidArgument, "base_snapshot_id %s is of volume %s, target %s of %s",
				base, baseVolume, snapshot, volume)
		}
	}
	reader, err := d.opts.Blocks.OpenBlocks(ctx)
	if err != nil {
		return blocksStatus(snapshot, err)
	}
	defer reader.Close()
	for first, next := true, &startingOffset; next != nil; first = false {
		page, err := reader.SnapshotBlocks(ctx, volume, snapshot, base, *next, int(maxResults))
		if err != nil {
			return blocksStatus(snapshot, err)
		}
		// Every message carries the size; an empty answer is one message.
		if first || len(page.Extents) > 0 {
			if err := send(page.VolumeSize, blockMetadata(page.Extents)); err != nil {
				return err
			}
		}
		next = page.Next
	}
	return nil
}

// snapshotVolume is the volume of a snapshot the plugin lists (its
// snapshot ID is the Strata snapshot's name).
func (d *Driver) snapshotVolume(field, id string) (string, error) {
	snap, err := d.ds.Snapshots.GetRO(id)
	switch {
	case apierrors.IsNotFound(err):
		return "", status.Errorf(codes.NotFound, "%s %s: no such snapshot", field, id)
	case err != nil:
		return "", status.Errorf(codes.Internal, "%s %s: %v", field, id, err)
	case !snap.Status.ReadyToUse:
		return "", status.Errorf(codes.FailedPrecondition, "%s %s: not taken yet", field, id)
	}
	return snap.Spec.Volume, nil
}

func blockMetadata(exts []engineapi.BlockExtent) []*csi.BlockMetadata {
	out := make([]*csi.BlockMetadata, 0, len(exts))
	for _, e := range exts {
		out = append(out, &csi.BlockMetadata{ByteOffset: e.Offset, SizeBytes: e.Length})
	}
	return out
}

func blocksStatus(snapshot string, err error) error {
	switch {
	case errors.Is(err, ErrBlocksNotFound):
		return status.Errorf(codes.NotFound, "snapshot %s: %v", snapshot, err)
	case errors.Is(err, ErrBlocksInvalid):
		return status.Errorf(codes.InvalidArgument, "snapshot %s: %v", snapshot, err)
	case errors.Is(err, ErrBlocksRefused):
		return status.Errorf(codes.Internal, "snapshot %s: %v", snapshot, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Unavailable, "reading the blocks of snapshot %s: %v", snapshot, err)
}

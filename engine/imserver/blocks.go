package imserver

import (
	"errors"
	"fmt"
	"slices"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// defaultBlocksPerMessage is how many extents a SnapshotBlocks message
// carries when the caller does not say: about 16 KiB of protobuf.
const defaultBlocksPerMessage = 1024

// SnapshotBlocks lists where a snapshot holds data, or what changed since
// an older snapshot of its chain, from one RW replica's extents (the plan
// a snapshot export or a backup reads by); no data is read.
func (s *Server) SnapshotBlocks(req *impb.SnapshotBlocksRequest, stream impb.InstanceManager_SnapshotBlocksServer) error {
	ctx := stream.Context()
	if err := validBlocksRequest(req); err != nil {
		return engineapi.ToStatus(err)
	}
	_, eng, err := s.runningEngine(req.Engine)
	if errors.Is(err, engineapi.ErrNotFound) {
		// The engine went (its volume detached) or is not here yet: a
		// caller that found it in a cache a moment behind asks again,
		// unlike for a snapshot that is not found.
		err = fmt.Errorf("engine %s is not running here: %w", req.Engine, engineapi.ErrBusy)
	}
	if err != nil {
		return engineapi.ToStatus(err)
	}
	fail := func(err error) error {
		return engineapi.ToStatus(translate(fmt.Errorf("blocks of snapshot %s of engine %s: %w", req.Snapshot, req.Engine, err)))
	}
	srcs, from, err := s.dialEngineReplica(ctx, eng)
	if err != nil {
		return fail(err)
	}
	defer closeAll(srcs)
	plan, err := planSnapshot(ctx, srcs[0], req.Snapshot, req.BaseSnapshot == "")
	if err != nil {
		return fail(err)
	}
	pieces := plan.pieces
	if req.BaseSnapshot != "" {
		if !slices.Contains(plan.path, req.BaseSnapshot) {
			return fail(fmt.Errorf("base snapshot %s is not in the chain below %s (not older, of another volume, or purged): %w",
				req.BaseSnapshot, req.Snapshot, engineapi.ErrInvalid))
		}
		pieces = deltaPieces(plan, req.BaseSnapshot)
	}
	exts := blockExtents(pieces, plan.volumeSize, req.StartingOffset)
	s.log.WithFields(logrus.Fields{"engine": req.Engine, "snapshot": req.Snapshot, "base": req.BaseSnapshot,
		"replica": from, "extents": len(exts)}).Debug("Snapshot blocks listed")
	per := int(req.MaxResults)
	if per == 0 {
		per = defaultBlocksPerMessage
	}
	// At least one message, so that the volume size always arrives.
	for first := true; first || len(exts) > 0; first = false {
		n := min(per, len(exts))
		msg := &impb.SnapshotBlocksResponse{VolumeSize: plan.volumeSize}
		for _, e := range exts[:n] {
			msg.Extents = append(msg.Extents, &impb.BlockExtent{Offset: e.Offset, Length: e.Length})
		}
		exts = exts[n:]
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
	return nil
}

func validBlocksRequest(req *impb.SnapshotBlocksRequest) error {
	switch {
	case req.Snapshot == "":
		return fmt.Errorf("snapshot: empty: %w", engineapi.ErrInvalid)
	case req.StartingOffset < 0:
		return fmt.Errorf("starting_offset: %d is negative: %w", req.StartingOffset, engineapi.ErrInvalid)
	case req.MaxResults < 0:
		return fmt.Errorf("max_results: %d is negative: %w", req.MaxResults, engineapi.ErrInvalid)
	case req.BaseSnapshot == req.Snapshot:
		return fmt.Errorf("base_snapshot: %s is the snapshot itself: %w", req.BaseSnapshot, engineapi.ErrInvalid)
	}
	return nil
}

// blockExtents merges pieces (split per layer and per read) into sorted,
// disjoint extents, cut at the start of the 4 KiB block holding from (so
// they stay block aligned; none ends before from).
func blockExtents(pieces []piece, volumeSize, from int64) []replicactl.Extent {
	from -= from % blockdev.BlockSize
	exts := make([]replicactl.Extent, 0, len(pieces))
	for _, p := range pieces {
		exts = append(exts, replicactl.Extent{Offset: p.off, Length: p.length})
	}
	exts = normalizeExtents(exts, volumeSize)
	i := 0
	for i < len(exts) && exts[i].Offset+exts[i].Length <= from {
		i++
	}
	exts = exts[i:]
	if len(exts) > 0 && exts[0].Offset < from {
		exts[0].Length -= from - exts[0].Offset
		exts[0].Offset = from
	}
	return exts
}

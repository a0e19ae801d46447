package imserver

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/blockdev"
	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// cloneProgress is what Watch tells about a clone while it runs.
type cloneProgress struct {
	snapshot, source string
	done, total      atomic.Int64
}

// percent is the share of the snapshot's data copied so far.
func (p *cloneProgress) percent() int32 {
	total := p.total.Load()
	if total <= 0 {
		return 0
	}
	return int32(min(p.done.Load()*100/total, 100))
}

func (p *cloneProgress) proto() *impb.CloneStatus {
	return &impb.CloneStatus{Snapshot: p.snapshot, SourceAddress: p.source, Progress: p.percent(),
		BytesDone: p.done.Load(), BytesTotal: p.total.Load()}
}

// startClone marks eng as being filled by a clone; nil if one already is.
func (s *Server) startClone(eng *replication.Engine, req *impb.SnapshotCloneRequest) *cloneProgress {
	p := &cloneProgress{snapshot: req.Snapshot, source: req.SourceAddress}
	if _, running := s.clones.LoadOrStore(eng, p); running {
		return nil
	}
	return p
}

func (s *Server) endClone(eng *replication.Engine) { s.clones.Delete(eng) }

// cloneStatus is the progress of the clone filling eng, nil when none runs.
func (s *Server) cloneStatus(eng *replication.Engine) *impb.CloneStatus {
	if p, ok := s.clones.Load(eng); ok {
		return p.(*cloneProgress).proto()
	}
	return nil
}

// cloneRunning reports whether a clone or a backup restore (restore.go) is
// filling eng. Operations that must not see a half-filled volume (starting
// the frontend, snapshot, revert) should refuse with engineapi.ErrBusy
// while it is true.
func (s *Server) cloneRunning(eng *replication.Engine) bool {
	_, running := s.clones.Load(eng)
	return running || s.restoreRunning(eng)
}

// SnapshotClone fills a new engine's volume with a snapshot of another
// volume: it connects to the source replica's dataconn address (any node),
// reads the snapshot's ancestry path there (see export.go) and writes the
// data through the target engine, which fans it out to all its replicas,
// then flushes. Afterwards the target volume reads exactly as the snapshot
// did, zeros beyond the source's size if the target is larger.
//
// A source over a backing file: by default the image's data is copied too,
// so the target needs no backing file. With backing_shared the target's
// replicas sit on the same image (their own copies of it), so blocks only
// the image holds already read right there and are not copied; the source
// and the target must then both have a backing file, of the same size.
// A target with a backing file and without backing_shared is zeroed first,
// so its image does not show where the snapshot reads zeros.
//
// The target must be running, with its frontend stopped and no snapshots.
// If its head holds data (an earlier attempt that failed) it is zeroed
// first, so a failed clone can simply be retried; over a backing file the
// zeroing hides the image, so the image's data is then copied even with
// backing_shared. Blocks of zeros the snapshot's layers hold are written as
// write-zeroes, so the target stays sparse. The call lasts as long as the
// copy and is cancelled with its context: give it a deadline that fits the
// data. No instance lock is held meanwhile.
//
// Errors: empty arguments, a target smaller than the source, a target with
// snapshots, the source's head or a removed snapshot, backing_shared with
// backing files missing or of different sizes are InvalidArgument; an
// unknown snapshot is NotFound; a frontend serving the target, another
// clone into it or a purge running on the source replica are Aborted
// (engineapi.ErrBusy). An unreachable source is an Internal error.
func (s *Server) SnapshotClone(ctx context.Context, req *impb.SnapshotCloneRequest) (*impb.Empty, error) {
	switch {
	case req.Engine == "":
		return nil, engineapi.ToStatus(fmt.Errorf("engine name is empty: %w", engineapi.ErrInvalid))
	case req.SourceAddress == "":
		return nil, engineapi.ToStatus(fmt.Errorf("source_address is empty: %w", engineapi.ErrInvalid))
	case req.Snapshot == "":
		return nil, engineapi.ToStatus(fmt.Errorf("snapshot name is empty: %w", engineapi.ErrInvalid))
	}
	inst, eng, err := s.runningEngine(req.Engine)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst.mu.Lock()
	serving := inst.endpoint != ""
	inst.mu.Unlock()
	if serving {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: stop the frontend before cloning into it: %w", req.Engine, engineapi.ErrBusy))
	}
	if s.restoreRunning(eng) {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: a restore is filling it: %w", req.Engine, engineapi.ErrBusy))
	}
	progress := s.startClone(eng, req)
	if progress == nil {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: a clone into it is already running: %w", req.Engine, engineapi.ErrBusy))
	}

	log := s.log.WithFields(logrus.Fields{"engine": req.Engine, "source": req.SourceAddress, "snapshot": req.Snapshot,
		"backingShared": req.BackingShared})
	err = s.clone(ctx, inst, eng, req, progress, log)
	s.endClone(eng)
	// Tell watchers about the new head size (and whatever a failure did).
	inst.mu.Lock()
	if inst.eng == eng {
		s.refreshChain(inst)
		s.publishLocked(inst)
	}
	inst.mu.Unlock()
	if err != nil {
		log.WithError(err).Warn("Snapshot clone failed")
		return nil, engineapi.ToStatus(translate(fmt.Errorf("clone snapshot %s from %s into engine %s: %w",
			req.Snapshot, req.SourceAddress, req.Engine, err)))
	}
	return &impb.Empty{}, nil
}

func (s *Server) clone(ctx context.Context, inst *instance, eng *replication.Engine, req *impb.SnapshotCloneRequest,
	status *cloneProgress, log logrus.FieldLogger) error {
	target, err := eng.Chain(ctx)
	if err != nil {
		return fmt.Errorf("reading the target's chain: %w", err)
	}
	for name := range target.Layers {
		if name != replicactl.HeadName {
			return fmt.Errorf("the target has snapshot %s; clone needs a new volume: %w", name, engineapi.ErrInvalid)
		}
	}

	// Leftovers of an earlier attempt are zeroed below; over a backing
	// file that hides the image, which must then be copied after all.
	leftovers := target.Layers[replicactl.HeadName].Size
	srcs, err := s.dialReplica(ctx, req.SourceAddress)
	if err != nil {
		return fmt.Errorf("source replica: %w", err)
	}
	defer closeAll(srcs)
	plan, err := planSnapshot(ctx, srcs[0], req.Snapshot, !req.BackingShared || leftovers > 0)
	if err != nil {
		return err
	}
	if size := eng.Size(); plan.volumeSize > size {
		return fmt.Errorf("the source volume has %d bytes, the target only %d: %w", plan.volumeSize, size, engineapi.ErrInvalid)
	}
	if req.BackingShared {
		if plan.backing == nil {
			return fmt.Errorf("backing_shared, but the source has no backing file: %w", engineapi.ErrInvalid)
		}
		if err := replicactl.SameBacking("the source", plan.backing, "the target", target.Backing); err != nil {
			return fmt.Errorf("backing_shared: %w", err)
		}
	}

	if leftovers > 0 || (target.Backing != nil && !req.BackingShared) {
		// Start from zeros: with no snapshot below, the replicas free the
		// space, and over a backing file they write zero blocks hiding it.
		log.WithFields(logrus.Fields{"allocated": leftovers, "targetBacking": target.Backing != nil}).
			Info("Zeroing the target before cloning")
		if err := eng.WriteZeroes(0, eng.Size()); err != nil {
			return fmt.Errorf("zeroing the target: %w", err)
		}
	}

	log.WithFields(logrus.Fields{"layers": len(plan.path), "bytes": plan.bytes}).Info("Snapshot clone started")
	progress := newProgressLog(log, "Snapshot clone", plan.bytes)
	status.total.Store(plan.bytes)
	s.publishClone(inst, eng)
	lastPct := int32(0)
	var written int64
	err = readPieces(ctx, srcs, plan.pieces, func(p piece, data []byte) error {
		err := splitZeroRuns(data, func(rel int, run []byte, zero bool) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			off := p.off + int64(rel)
			if zero {
				// Zeros the layer holds: the target frees the space, or
				// keeps zeros where a lower layer of its own has data.
				if err := eng.WriteZeroes(off, int64(len(run))); err != nil {
					return fmt.Errorf("zeroing at %d: %w", off, err)
				}
				return nil
			}
			if _, err := eng.WriteAt(run, off); err != nil {
				return fmt.Errorf("writing at %d: %w", off, err)
			}
			written += int64(len(run))
			return nil
		})
		progress.add(p.length)
		status.done.Add(p.length)
		if pct := status.percent(); pct != lastPct {
			// Watchers (the clone controller's progress column) hear of
			// every whole percent, at most 100 events a clone.
			lastPct = pct
			s.publishClone(inst, eng)
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := eng.Flush(); err != nil {
		return fmt.Errorf("flushing the target: %w", err)
	}
	progress.finish(written)
	for _, r := range eng.Replicas() {
		if r.Mode != replication.ModeRW {
			// The volume has the data; this replica needs a rebuild.
			log.WithFields(logrus.Fields{"replica": r.Name, "mode": r.Mode, "error": r.Error}).
				Warn("Replica did not take the whole clone")
		}
	}
	return nil
}

// publishClone tells watchers the clone's progress.
func (s *Server) publishClone(inst *instance, eng *replication.Engine) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.eng == eng {
		s.publishLocked(inst)
	}
}

var zeroBlock [blockdev.BlockSize]byte

// splitZeroRuns calls fn for each maximal run of blocks of data that are
// all zeros or all not, in order, with the run's offset in data.
func splitZeroRuns(data []byte, fn func(rel int, run []byte, zero bool) error) error {
	start, startZero := 0, false
	for off := 0; off < len(data); off += blockdev.BlockSize {
		blk := data[off:min(off+blockdev.BlockSize, len(data))]
		zero := bytes.Equal(blk, zeroBlock[:len(blk)])
		if off == 0 {
			startZero = zero
			continue
		}
		if zero != startZero {
			if err := fn(start, data[start:off], startZero); err != nil {
				return err
			}
			start, startZero = off, zero
		}
	}
	if start < len(data) {
		return fn(start, data[start:], startZero)
	}
	return nil
}

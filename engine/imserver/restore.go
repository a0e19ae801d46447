package imserver

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/backupstore"
)

// restoreProgressInterval is how often a restore's fetched bytes are
// looked at for Watch (published only at a new whole percent).
const restoreProgressInterval = 500 * time.Millisecond

type restoreJob struct {
	jobStatus
	backup, volume string
}

func (j *restoreJob) proto() *impb.RestoreStatus {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := &impb.RestoreStatus{Backup: j.backup, Volume: j.volume, State: j.state, Progress: j.percent(),
		BytesDone: j.done.Load(), BytesTotal: j.total.Load(), Error: j.err}
	if j.state == engineapi.JobStateCompleted {
		st.Progress = 100
	} else if st.Progress == 100 {
		st.Progress = 99 // fetched, not yet written and flushed
	}
	return st
}

// restoreStatus renders the restore into eng, nil if none ran.
func (s *Server) restoreStatus(eng *replication.Engine) *impb.RestoreStatus {
	s.jobs.mu.Lock()
	j := s.jobs.restores[eng]
	s.jobs.mu.Unlock()
	if j == nil {
		return nil
	}
	return j.proto()
}

// BackupRestore starts filling a new engine's volume with a backup and
// returns; the job is in the instance's restore_status. Every chunk is
// checked against its SHA-256 (backupstore.Restore): a bad one fails the
// restore with a message naming the backup and the chunk, never zeroes.
// The same restore again while it runs or once it completed is a no-op;
// after it failed it starts over (the volume is zeroed first).
//
// The target must be running with its frontend stopped and no snapshots;
// its frontend, snapshots, revert and clones are refused while the restore
// runs. With backing, its replicas sit on the backup's backing image, whose
// chunks are then not written; a target on a backing file restored
// without backing is zeroed first, so its image does not show through.
//
// Errors: empty arguments, a volume or backup name that is not a DNS-1123
// subdomain, a bad target URL, a target with snapshots, or backing
// without a backing file are InvalidArgument; a frontend serving, a clone,
// backup or restore running Aborted (engineapi.ErrBusy). A
// missing backup, a volume too small and damaged chunks are in the status.
func (s *Server) BackupRestore(ctx context.Context, req *impb.BackupRestoreRequest) (*impb.Empty, error) {
	if req.Engine == "" {
		return nil, engineapi.ToStatus(fmt.Errorf("engine is empty: %w", engineapi.ErrInvalid))
	}
	if err := checkBackupNames(req.Volume, req.Backup, ""); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	if err := checkConcurrency("concurrency", req.Concurrency); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	store, err := s.openStore(req.Target)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst, eng, err := s.runningEngine(req.Engine)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst.mu.Lock()
	serving := inst.endpoint != ""
	inst.mu.Unlock()
	if serving {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: stop the frontend before restoring into it: %w", req.Engine, engineapi.ErrBusy))
	}
	chain, err := eng.Chain(ctx)
	if err != nil {
		return nil, engineapi.ToStatus(translate(fmt.Errorf("engine %s: reading the chain: %w", req.Engine, err)))
	}
	for name := range chain.Layers {
		if name != replicactl.HeadName {
			return nil, engineapi.ToStatus(fmt.Errorf("engine %s has snapshot %s; restore needs a new volume: %w",
				req.Engine, name, engineapi.ErrInvalid))
		}
	}
	if req.Backing && chain.Backing == nil {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: backing, but its replicas have no backing file: %w",
			req.Engine, engineapi.ErrInvalid))
	}

	job, jctx, err := claimJob(s, &s.jobs.restores, eng, req.Engine,
		func(old *restoreJob) bool { return old.backup == req.Backup && old.volume == req.Volume },
		func(cancel context.CancelFunc) *restoreJob {
			j := &restoreJob{backup: req.Backup, volume: req.Volume}
			j.cancel, j.state = cancel, engineapi.JobStateInProgress
			return j
		})
	if err != nil {
		return nil, err
	}
	if job == nil {
		return &impb.Empty{}, nil // running or done: the manager retried
	}

	log := s.log.WithFields(logrus.Fields{"engine": req.Engine, "backup": req.Backup, "volume": req.Volume,
		"target": req.Target.GetUrl(), "backing": req.Backing})
	s.publishClone(inst, eng)
	go func() {
		defer job.cancel()
		err := s.restore(jctx, inst, eng, store, req, chain, job, log)
		if err != nil {
			err = fmt.Errorf("restore into engine %s: %w", req.Engine, err)
			log.WithError(err).Warn("Backup restore failed")
		}
		job.finish(err)
		inst.mu.Lock()
		if inst.eng == eng {
			s.refreshChain(inst)
			s.publishLocked(inst)
		}
		inst.mu.Unlock()
	}()
	return &impb.Empty{}, nil
}

func (s *Server) restore(ctx context.Context, inst *instance, eng *replication.Engine, store backupstore.ObjectStore,
	req *impb.BackupRestoreRequest, chain replicactl.ChainReply, job *restoreJob, log logrus.FieldLogger) error {
	counting := backupstore.NewCountingStore(store)
	target, err := backupstore.Open(ctx, counting, backupstore.Options{Logger: log})
	if err != nil {
		return err
	}
	m, err := target.LoadManifest(ctx, req.Volume, req.Backup)
	if err != nil {
		return fmt.Errorf("backup %s of volume %s: %w", req.Backup, req.Volume, err)
	}
	if size := eng.Size(); m.VolumeSize > size {
		return fmt.Errorf("backup %s of volume %s has %d bytes, the volume only %d", req.Backup, req.Volume, m.VolumeSize, size)
	}
	// The engine takes concurrent writes (its NBD export does the same).
	opts := backupstore.RestoreOptions{BackingAlreadyThere: req.Backing, Concurrency: int(req.Concurrency), ParallelWrites: true}
	var backing io.ReaderAt

	// Start from zeros when the head holds an earlier attempt's data, or an
	// image the backup does not build on shows through: with no snapshot
	// below, the replicas free the space; over a backing file they write
	// zero blocks hiding it.
	leftovers := chain.Layers[replicactl.HeadName].Size
	if leftovers > 0 || (chain.Backing != nil && !req.Backing) {
		log.WithFields(logrus.Fields{"allocated": leftovers, "targetBacking": chain.Backing != nil}).
			Info("Zeroing the volume before restoring")
		if err := eng.WriteZeroes(0, eng.Size()); err != nil {
			return fmt.Errorf("zeroing the volume: %w", err)
		}
		if req.Backing {
			// The zeroing hid the image too: its chunks are copied from a
			// replica's own backing file instead.
			srcs, from, err := s.dialEngineReplica(ctx, eng)
			if err != nil {
				return fmt.Errorf("reading the backing file: %w", err)
			}
			defer closeAll(srcs)
			backing = newLayerReader(ctx, srcs, s.localLayers(eng, from), layerPieces(replicactl.BackingName, eng.Size()))
			opts.BackingAlreadyThere, opts.WriteZeroes = false, false
		}
	}

	job.total.Store(m.Stats.StoredBytes)
	stop := s.followRestore(inst, eng, counting, job)
	log.WithFields(logrus.Fields{"chunks": m.Stats.DataChunks, "storedBytes": m.Stats.StoredBytes,
		"backingChunks": m.Stats.BackingChunks}).Info("Backup restore started")
	err = target.Restore(ctx, m, engineWriter{eng}, backing, opts)
	stop()
	if err != nil {
		return err
	}
	if err := eng.Flush(); err != nil {
		return fmt.Errorf("flushing the volume: %w", err)
	}
	for _, r := range eng.Replicas() {
		if r.Mode != replication.ModeRW {
			log.WithFields(logrus.Fields{"replica": r.Name, "mode": r.Mode, "error": r.Error}).
				Warn("Replica did not take the whole restore")
		}
	}
	log.Info("Backup restore complete")
	return nil
}

// followRestore publishes the restore's fetched bytes at every whole
// percent until stop is called.
func (s *Server) followRestore(inst *instance, eng *replication.Engine, counting *backupstore.CountingStore, job *restoreJob) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(restoreProgressInterval)
		defer tick.Stop()
		last := int32(-1)
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			job.done.Store(min(counting.Counts()["GetRange"].Bytes, job.total.Load()))
			if pct := job.percent(); pct != last {
				last = pct
				s.publishClone(inst, eng)
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		job.done.Store(job.total.Load())
	}
}

// layerPieces covers [0, size) of one layer with read-layer sized pieces.
func layerPieces(layer string, size int64) []piece {
	var out []piece
	for off := int64(0); off < size; off += layerReadSize {
		out = append(out, piece{layer: layer, off: off, length: min(layerReadSize, size-off)})
	}
	return out
}

// engineWriter writes a restore through an engine, so every replica gets
// it; blocks of zeros go as write-zeroes, keeping the volume sparse.
type engineWriter struct{ eng *replication.Engine }

func (w engineWriter) WriteAt(p []byte, off int64) (int, error) {
	err := splitZeroRuns(p, func(rel int, run []byte, zero bool) error {
		at := off + int64(rel)
		if zero {
			if err := w.eng.WriteZeroes(at, int64(len(run))); err != nil {
				return fmt.Errorf("zeroing at %d: %w", at, err)
			}
			return nil
		}
		if _, err := w.eng.WriteAt(run, at); err != nil {
			return fmt.Errorf("writing at %d: %w", at, err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

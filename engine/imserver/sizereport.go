package imserver

import (
	"context"
	"time"

	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engineapi/impb"
)

// Size reporting. A volume's head (and, during a purge, its snapshots)
// changes allocated size with every write, but publishing on every write
// would flood watchers and put a control call, which is a barrier on the
// replica connection, into the I/O path. Instead one reporter per instance
// manager wakes every Options.SizeReportInterval (a round) and, for each
// engine:
//
//   - skips it without any call if its DataVersion has not moved since the
//     cached chain was read and no purge is being followed: an idle volume
//     costs a counter comparison and sends nothing;
//   - while writes go on (the version moved since the last round) reads it
//     only every busyRoundsPerRead rounds, so a busy volume costs one read
//     and at most one status write per few seconds;
//   - once the version holds still for a round (a burst ended), reads it at
//     once: status follows a burst within two rounds of its end (issue 43:
//     a 5 s poll left actualSize at 430 KB 4 s after 64 MiB were synced);
//   - a read is one control call on one replica (the chain), plus the purge
//     status while a purge runs, made without holding the instance lock,
//     and publishes only if the rendering changed.
//
// Replica instances are re-rendered too (in memory): an engine's
// VolumeExpand grows them, and this is how their watchers learn it.

// DefaultSizeReportInterval is used when Options.SizeReportInterval is 0.
const DefaultSizeReportInterval = time.Second

// busyRoundsPerRead: how many rounds a volume under continuous writes waits
// between reads (5 s at the default interval).
const busyRoundsPerRead = 5

// sizeReadTimeout bounds one chain or purge-status read; a slow replica
// delays only its own engine's next report (see instance.refreshing).
const sizeReadTimeout = 30 * time.Second

func (s *Server) reportSizes(interval time.Duration) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		insts := make([]*instance, 0, len(s.instances))
		for _, inst := range s.instances {
			insts = append(insts, inst)
		}
		s.mu.Unlock()
		for _, inst := range insts {
			if inst.spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA {
				s.reportReplica(inst)
				continue
			}
			if !inst.refreshing.CompareAndSwap(false, true) {
				continue // the last read is still running
			}
			s.wg.Go(func() {
				defer inst.refreshing.Store(false)
				s.reportEngine(inst)
			})
		}
	}
}

// reportReplica publishes a replica instance whose size changed. An
// instance busy with an operation is left for the next round.
func (s *Server) reportReplica(inst *instance) {
	if !inst.mu.TryLock() {
		return
	}
	defer inst.mu.Unlock()
	if inst.rep != nil {
		s.publishLocked(inst)
	}
}

// reportEngine re-reads an engine's chain if it may have changed and
// publishes what did.
func (s *Server) reportEngine(inst *instance) {
	// TryLock: an operation holding the lock refreshes the chain itself.
	if !inst.mu.TryLock() {
		return
	}
	eng, gen, purging := inst.eng, inst.chainGen, inst.purging
	version := uint64(0)
	if eng != nil {
		version = eng.DataVersion()
	}
	idle := eng == nil || (version == inst.reportedVersion && !purging && !inst.chainStale)
	wait := !idle && inst.busyWait(version)
	inst.mu.Unlock()
	if idle || wait {
		return
	}

	s.sizeReads.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), sizeReadTimeout)
	defer cancel()
	// The purge status first: a purge seen finished here has finished
	// before the chain is read, so the last chain published shows its end
	// (a snapshot it dropped is gone), not a moment before.
	var purge map[string]*impb.PurgeStatus
	if purging {
		purge = purgeStatusProto(eng.PurgeStatus(ctx))
	}
	chain, err := eng.Chain(ctx)

	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.eng != eng {
		return // stopped or recreated meanwhile
	}
	if purging && inst.purging {
		s.setPurgeLocked(inst, purge)
	}
	// An operation that refreshed the chain meanwhile has a newer one.
	if inst.chainGen == gen {
		s.setChainLocked(inst, chain, err, version)
	}
	s.publishLocked(inst)
}

// busyWait reports whether a round should skip reading an engine whose
// data changed: it does while writes go on (the version moved since the
// last round), except every busyRoundsPerRead-th round. A purge or a stale
// chain is read at once. The caller holds inst.mu.
func (inst *instance) busyWait(version uint64) bool {
	moving := version != inst.roundVersion
	inst.roundVersion = version
	if !moving || inst.purging || inst.chainStale {
		inst.busyRounds = 0
		return false
	}
	if inst.busyRounds++; inst.busyRounds < busyRoundsPerRead {
		return true
	}
	inst.busyRounds = 0
	return false
}

// setPurgeLocked caches a purge status read; once no replica purges any
// more, the reporter stops following it. The caller holds inst.mu.
func (s *Server) setPurgeLocked(inst *instance, st map[string]*impb.PurgeStatus) {
	inst.purge = st
	running := false
	for _, p := range st {
		running = running || p.IsPurging
	}
	if !running && inst.purging {
		// The chain may have changed up to the purge's end, after the
		// last read: the next round reads it once more.
		inst.purging, inst.chainStale = false, true
	}
}

func purgeStatusProto(st map[string]replicactl.PurgeStatusReply) map[string]*impb.PurgeStatus {
	out := make(map[string]*impb.PurgeStatus, len(st))
	for name, p := range st {
		out[name] = &impb.PurgeStatus{IsPurging: p.IsPurging, Progress: int32(p.Progress), State: p.State, Error: p.Error}
	}
	return out
}

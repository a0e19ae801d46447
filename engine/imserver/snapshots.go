package imserver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/internal/errclass"
	"github.com/strata-storage/strata/engine/replicactl"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/fsfreeze"
)

// engineOp runs fn on a running engine under its instance lock, refreshes
// the cached chain and tells watchers. Errors come back as gRPC statuses.
func (s *Server) engineOp(name string, fn func(inst *instance) error) error {
	inst, err := s.getEngine(name)
	if err != nil {
		return engineapi.ToStatus(err)
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if inst.eng == nil {
		return engineapi.ToStatus(fmt.Errorf("engine %s stopped: %w", name, engineapi.ErrBusy))
	}
	opErr := fn(inst)
	s.refreshChain(inst)
	// Published only if something changed, so read-only calls (a
	// purge-status poll, a snapshot list) cost watchers nothing.
	s.publishLocked(inst)
	return engineapi.ToStatus(translate(opErr))
}

// translate turns data-connection error classes into engineapi ones, so a
// refusal by a replica reaches the manager as the right gRPC code.
func translate(err error) error {
	return errclass.Map(err,
		errclass.Rule{From: dataconn.ErrNotFound, To: engineapi.ErrNotFound},
		errclass.Rule{From: replication.ErrSnapshotNotFound, To: engineapi.ErrNotFound},
		errclass.Rule{From: dataconn.ErrAlreadyExists, To: engineapi.ErrAlreadyExists},
		errclass.Rule{From: dataconn.ErrLimitExceeded, To: engineapi.ErrLimitExceeded},
		errclass.Rule{From: dataconn.ErrInvalidArgument, To: engineapi.ErrInvalid},
		errclass.Rule{From: replication.ErrBusy, To: engineapi.ErrBusy},
		errclass.Rule{From: replication.ErrFreezeLost, To: engineapi.ErrFreezeLost},
		errclass.Rule{From: replicactl.ErrBackingMismatch, To: engineapi.ErrInvalid},
	)
}

// refreshChain re-reads the snapshot chain into the cache that Watch and
// InstanceGet report; the caller holds inst.mu.
func (s *Server) refreshChain(inst *instance) {
	version := inst.eng.DataVersion()
	chain, err := inst.eng.Chain(context.Background())
	s.setChainLocked(inst, chain, err, version)
}

// setChainLocked caches a chain read when the engine's DataVersion was
// version; the caller holds inst.mu. A failure is reported in the
// instance's error, and the old chain is kept.
func (s *Server) setChainLocked(inst *instance, chain replicactl.ChainReply, err error, version uint64) {
	inst.chainGen++
	if err != nil {
		inst.err = fmt.Sprintf("reading the snapshot chain: %v", err)
		return
	}
	inst.reportedVersion, inst.chainStale = version, false
	snaps := make(map[string]*impb.Snapshot, len(chain.Layers))
	for name, l := range chain.Layers {
		children := append([]string(nil), l.Children...)
		sort.Strings(children)
		snaps[name] = &impb.Snapshot{Name: name, Parent: l.Parent, Children: children, Removed: l.Removed,
			UserCreated: l.UserCreated, Created: l.Created, Size: l.Size, Labels: l.Labels, Exclusive: l.Exclusive}
	}
	inst.snapshots = snaps
}

// SnapshotCreate takes a snapshot; an empty name gets a generated one.
func (s *Server) SnapshotCreate(ctx context.Context, req *impb.SnapshotCreateRequest) (*impb.SnapshotCreateResponse, error) {
	if err := checkLabels("labels", req.Labels); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	name := req.Name
	if name == "" {
		name = uuid.NewString()[:8]
	}
	inst, err := s.getEngine(req.Engine)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	// A group cut's filesystems were frozen by EngineFreeze; a snapshot of
	// its own freezes here, outside the instance's lock (fsfreeze.go).
	consistency := fsfreeze.Crash
	if req.Cut != "" {
		if v, ok := s.fsCuts.Load(fsCutKey(req.Engine, req.Cut)); ok {
			consistency = v.(fsfreeze.Consistency)
		}
	} else if !s.hasSnapshot(inst, name) {
		// A name the chain has is refused below: no application stall for it.
		if consistency, err = s.freezeFS(ctx, inst.spec.VolumeName, name, time.Duration(req.FsFreezeTimeoutMs)*time.Millisecond); err != nil {
			return nil, engineapi.ToStatus(err)
		}
	}
	err = s.engineOp(req.Engine, func(inst *instance) error {
		if err := s.refuseDuringClone(inst, "take a snapshot"); err != nil {
			return err
		}
		if _, ok := inst.snapshots[name]; ok {
			return fmt.Errorf("snapshot %s of engine %s: %w", name, req.Engine, engineapi.ErrAlreadyExists)
		}
		opts := replication.SnapshotOptions{UserCreated: req.UserCreated, Labels: withConsistency(req.Labels, consistency)}
		if req.Cut != "" {
			return inst.eng.SnapshotInCut(ctx, req.Cut, name, opts)
		}
		return inst.eng.Snapshot(ctx, name, opts)
	})
	if req.Cut == "" {
		if thawErr := s.thawFS(inst.spec.VolumeName, name, consistency); thawErr != nil && err == nil {
			// The freeze ended before the cut did: what it holds is not
			// what the freeze promised. Drop it; the manager retries.
			rmErr := s.engineOp(req.Engine, func(inst *instance) error { return inst.eng.RemoveSnapshot(ctx, name) })
			return nil, engineapi.ToStatus(errors.Join(thawErr, rmErr))
		}
	}
	if err != nil {
		return nil, err
	}
	return &impb.SnapshotCreateResponse{Name: name}, nil
}

// hasSnapshot tells whether the engine's cached chain has name.
func (s *Server) hasSnapshot(inst *instance, name string) bool {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	_, ok := inst.snapshots[name]
	return ok
}

// SnapshotList reads the chain from a replica (not the cache).
func (s *Server) SnapshotList(ctx context.Context, ref *impb.InstanceRef) (*impb.SnapshotListResponse, error) {
	var out map[string]*impb.Snapshot
	err := s.engineOp(ref.Name, func(inst *instance) error {
		out = inst.snapshots
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &impb.SnapshotListResponse{Snapshots: out}, nil
}

// SnapshotRemove marks snapshots removed; SnapshotPurge frees their data.
func (s *Server) SnapshotRemove(ctx context.Context, req *impb.SnapshotRemoveRequest) (*impb.Empty, error) {
	if err := checkCount("names", len(req.Names), maxSnapshotNames); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	err := s.engineOp(req.Engine, func(inst *instance) error {
		for _, name := range req.Names {
			if err := inst.eng.RemoveSnapshot(ctx, name); err != nil {
				return err
			}
		}
		return nil
	})
	return &impb.Empty{}, err
}

// SnapshotPurge starts a purge on every replica. The size reporter then
// follows it, publishing its progress and the chain it leaves.
func (s *Server) SnapshotPurge(ctx context.Context, ref *impb.InstanceRef) (*impb.Empty, error) {
	return &impb.Empty{}, s.engineOp(ref.Name, func(inst *instance) error {
		if err := inst.eng.StartPurge(ctx); err != nil {
			return err
		}
		inst.purging = true
		return nil
	})
}

// SnapshotPurgeStatus reports each replica's purge progress.
func (s *Server) SnapshotPurgeStatus(ctx context.Context, ref *impb.InstanceRef) (*impb.PurgeStatusResponse, error) {
	out := &impb.PurgeStatusResponse{Status: map[string]*impb.PurgeStatus{}}
	err := s.engineOp(ref.Name, func(inst *instance) error {
		out.Status = purgeStatusProto(inst.eng.PurgeStatus(ctx))
		s.setPurgeLocked(inst, out.Status)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SnapshotRevert reverts the volume to a snapshot. Its frontend must be
// stopped: a client must not see the data change under it.
func (s *Server) SnapshotRevert(ctx context.Context, req *impb.SnapshotRevertRequest) (*impb.Empty, error) {
	return &impb.Empty{}, s.engineOp(req.Engine, func(inst *instance) error {
		if inst.endpoint != "" {
			return fmt.Errorf("engine %s: stop the frontend before reverting: %w", req.Engine, engineapi.ErrBusy)
		}
		if err := s.refuseDuringClone(inst, "revert"); err != nil {
			return err
		}
		return inst.eng.Revert(ctx, req.Name)
	})
}

// SnapshotLimitsSet sets the user snapshot limits on every replica.
func (s *Server) SnapshotLimitsSet(ctx context.Context, req *impb.SnapshotLimitsRequest) (*impb.Empty, error) {
	if req.MaxCount < 0 || req.MaxSize < 0 {
		return nil, engineapi.ToStatus(fmt.Errorf("snapshot limits must not be negative: %w", engineapi.ErrInvalid))
	}
	return &impb.Empty{}, s.engineOp(req.Engine, func(inst *instance) error {
		inst.spec.SnapshotMaxCount, inst.spec.SnapshotMaxSize = req.MaxCount, req.MaxSize
		return inst.eng.SetLimits(ctx, int(req.MaxCount), req.MaxSize)
	})
}

// VolumeExpand grows the volume on every replica.
func (s *Server) VolumeExpand(ctx context.Context, req *impb.VolumeExpandRequest) (*impb.Empty, error) {
	if err := checkVolumeSize("size", req.Size); err != nil {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s: %w", req.Engine, err))
	}
	volume := ""
	err := s.engineOp(req.Engine, func(inst *instance) error {
		// Online too: replicas grow under the I/O (replica.Expand swaps its
		// maps under the I/O lock) and no client is told of a range before
		// every replica has it. Connected NBD clients keep the size they
		// were told, except on the growable export.
		if err := inst.eng.Expand(ctx, req.Size); err != nil {
			return err
		}
		inst.spec.Size = req.Size
		volume = inst.spec.VolumeName
		return nil
	})
	if err != nil {
		return nil, err
	}
	// This instance manager's replicas of the volume grew behind their
	// instances' backs: tell watchers now rather than at the next size report.
	s.publishReplicasOf(volume)
	return &impb.Empty{}, nil
}

func (s *Server) publishReplicasOf(volume string) {
	s.mu.Lock()
	var reps []*instance
	for _, inst := range s.instances {
		if inst.spec.Type == impb.InstanceType_INSTANCE_TYPE_REPLICA && inst.spec.VolumeName == volume {
			reps = append(reps, inst)
		}
	}
	s.mu.Unlock()
	for _, inst := range reps {
		inst.mu.Lock()
		if inst.rep != nil {
			s.publishLocked(inst)
		}
		inst.mu.Unlock()
	}
}

// FrontendStart serves the engine over NBD.
func (s *Server) FrontendStart(_ context.Context, req *impb.FrontendStartRequest) (*impb.Instance, error) {
	if req.Frontend != "nbd" {
		return nil, engineapi.ToStatus(fmt.Errorf("frontend %q is not nbd: %w", req.Frontend, engineapi.ErrInvalid))
	}
	var out *impb.Instance
	err := s.engineOp(req.Engine, func(inst *instance) error {
		if err := s.refuseDuringClone(inst, "start the frontend"); err != nil {
			return err
		}
		if inst.endpoint == "" {
			inst.spec.Frontend = req.Frontend
			if err := s.startFrontend(inst); err != nil {
				return err
			}
		}
		out = s.toProto(inst)
		return nil
	})
	return out, err
}

// FrontendStop stops serving the engine; its connected clients are closed.
func (s *Server) FrontendStop(_ context.Context, ref *impb.InstanceRef) (*impb.Instance, error) {
	var out *impb.Instance
	err := s.engineOp(ref.Name, func(inst *instance) error {
		inst.spec.Frontend = ""
		if err := s.stopFrontend(inst); err != nil {
			return err
		}
		out = s.toProto(inst)
		return nil
	})
	return out, err
}

// ReplicaAdd attaches a replica to a running engine. Without rebuild the
// replica must already hold the volume's data (RW at once). With rebuild it
// must be new and empty: it joins WO and is filled in the background (see
// rebuild.go); it returns once the replica takes writes.
func (s *Server) ReplicaAdd(ctx context.Context, req *impb.ReplicaAddRequest) (*impb.Empty, error) {
	return &impb.Empty{}, s.engineOp(req.Engine, func(inst *instance) error {
		if n := len(inst.eng.Replicas()); n >= maxEngineReplicas {
			return fmt.Errorf("engine %s has %d replicas, the most one takes: %w", req.Engine, n, engineapi.ErrLimitExceeded)
		}
		if req.Rebuild {
			return s.startRebuild(ctx, inst, req)
		}
		return s.connectReplica(inst.eng, req.Replica, req.Address, replication.ModeRW)
	})
}

// ReplicaRemove detaches a replica from an engine.
func (s *Server) ReplicaRemove(_ context.Context, req *impb.ReplicaRemoveRequest) (*impb.Empty, error) {
	return &impb.Empty{}, s.engineOp(req.Engine, func(inst *instance) error {
		if _, _, ok := inst.eng.Backend(req.Replica); !ok {
			return fmt.Errorf("engine %s has no replica %s: %w", req.Engine, req.Replica, engineapi.ErrNotFound)
		}
		return inst.eng.RemoveReplica(req.Replica)
	})
}

// refuseDuringClone keeps clients and snapshots off a volume that a clone
// is still filling: its content is not the snapshot's yet.
func (s *Server) refuseDuringClone(inst *instance, what string) error {
	if s.cloneRunning(inst.eng) {
		return fmt.Errorf("engine %s: cannot %s while a clone fills the volume: %w", inst.spec.Name, what, engineapi.ErrBusy)
	}
	return nil
}

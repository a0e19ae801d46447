package imserver

import (
	"context"
	"fmt"
	"time"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
)

// Rebuild through the instance manager: ReplicaAdd with rebuild=true
// attaches the replica (new, or one that failed and was recreated on its
// directory, whose unchanged snapshots are kept) in WO mode and returns; the copy runs in the
// engine (replication.Engine.StartRebuild) in the background. Its progress
// is in ReplicaRebuildStatus and in the engine instance's rebuild_status,
// which Watch publishes as it changes. A rebuild while a purge runs (or
// another rebuild), and a purge or other chain change while a rebuild runs,
// are refused with engineapi.ErrBusy.

// rebuildCallTimeout bounds each call on the rebuild's own connections.
const rebuildCallTimeout = 60 * time.Second

// startRebuild is ReplicaAdd with rebuild; the caller holds inst.mu.
func (s *Server) startRebuild(ctx context.Context, inst *instance, req *impb.ReplicaAddRequest) error {
	if req.Replica == "" || req.Address == "" {
		return fmt.Errorf("replica name and address are required: %w", engineapi.ErrInvalid)
	}
	if _, _, ok := inst.eng.Backend(req.Replica); ok {
		return fmt.Errorf("engine %s already has replica %s: %w", req.Engine, req.Replica, engineapi.ErrAlreadyExists)
	}
	// A rebuild snapshots the volume, and a volume a clone is filling must
	// have none: the rebuild waits for the clone.
	if err := s.refuseDuringClone(inst, "rebuild a replica"); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	target, err := dataconn.Dial(dctx, req.Address, s.dataOptions(req.Address, 30*time.Second))
	if err != nil {
		return fmt.Errorf("replica %s at %s: %w", req.Replica, req.Address, err)
	}
	_, err = inst.eng.StartRebuild(ctx, replication.RebuildOptions{
		Replica: req.Replica, Address: req.Address, Target: target,
		Dial: func(ctx context.Context, address string) (replication.Backend, error) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return dataconn.Dial(dctx, address, s.dataOptions(address, rebuildCallTimeout))
		},
	})
	if err != nil {
		target.Close()
		return err
	}
	return nil
}

// ReplicaRebuildStatus reports the rebuilds of an engine's replicas.
func (s *Server) ReplicaRebuildStatus(_ context.Context, ref *impb.InstanceRef) (*impb.RebuildStatusResponse, error) {
	inst, err := s.getEngine(ref.Name)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	inst.mu.Lock()
	eng := inst.eng
	inst.mu.Unlock()
	if eng == nil {
		return nil, engineapi.ToStatus(fmt.Errorf("engine %s stopped: %w", ref.Name, engineapi.ErrBusy))
	}
	return &impb.RebuildStatusResponse{Status: rebuildStatusProto(eng)}, nil
}

func rebuildStatusProto(eng *replication.Engine) map[string]*impb.RebuildStatus {
	out := map[string]*impb.RebuildStatus{}
	for name, st := range eng.RebuildStatus() {
		out[name] = &impb.RebuildStatus{IsRebuilding: st.IsRebuilding, Progress: int32(st.Progress),
			State: st.State, Error: st.Error, FromReplica: st.FromReplica, CopiedBytes: st.CopiedBytes,
			KeptBytes: st.KeptBytes, CopiedLayers: int32(st.CopiedLayers), KeptLayers: int32(st.KeptLayers)}
	}
	return out
}

package imserver

import (
	"context"
	"fmt"
	"time"

	"github.com/strata-storage/strata/engine/replication"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/fsfreeze"
)

// EngineFreeze freezes an engine for a group cut (replication/freeze.go).
func (s *Server) EngineFreeze(ctx context.Context, req *impb.EngineFreezeRequest) (*impb.Empty, error) {
	if req.Cut == "" {
		return nil, engineapi.ToStatus(fmt.Errorf("cut: required: %w", engineapi.ErrInvalid))
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout <= 0 || timeout > replication.MaxFreeze {
		return nil, engineapi.ToStatus(fmt.Errorf("timeout_ms %d: must be above 0 and at most %d: %w",
			req.TimeoutMs, replication.MaxFreeze.Milliseconds(), engineapi.ErrInvalid))
	}
	inst, err := s.getEngine(req.Engine)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	// The filesystem first: its freeze writes the page cache out through
	// this engine, which must still take writes (fsfreeze.go).
	volume, key := inst.spec.VolumeName, fsCutKey(req.Engine, req.Cut)
	consistency, err := s.freezeFS(ctx, volume, req.Cut, time.Duration(req.FsFreezeTimeoutMs)*time.Millisecond)
	if err != nil {
		return nil, engineapi.ToStatus(err)
	}
	s.fsCuts.Store(key, consistency)
	err = s.engineOp(req.Engine, func(inst *instance) error {
		if err := s.refuseDuringClone(inst, "freeze"); err != nil {
			return err
		}
		if err := inst.eng.Freeze(ctx, req.Cut, timeout); err != nil {
			return err
		}
		s.frozen.Store(req.Engine, inst.eng)
		return nil
	})
	if err != nil {
		s.fsCuts.Delete(key)
		_ = s.thawFS(volume, req.Cut, consistency)
		return nil, err
	}
	return &impb.Empty{}, nil
}

// thawCutFS thaws the filesystem EngineFreeze froze for a cut, if any.
func (s *Server) thawCutFS(engine, cut string) error {
	v, ok := s.fsCuts.LoadAndDelete(fsCutKey(engine, cut))
	if !ok {
		return nil
	}
	inst, err := s.getEngine(engine)
	if err != nil {
		return nil // gone: the plugin's watchdog thaws
	}
	return s.thawFS(inst.spec.VolumeName, cut, v.(fsfreeze.Consistency))
}

// EngineThaw ends an engine's freeze for a cut; a cut not frozen (thawed,
// timed out) is success, so a caller may retry it. It does not take the
// instance's lock: a call holding it may be waiting for this very thaw.
func (s *Server) EngineThaw(ctx context.Context, req *impb.EngineThawRequest) (*impb.Empty, error) {
	if v, ok := s.frozen.Load(req.Engine); ok {
		eng := v.(*replication.Engine)
		eng.Thaw(req.Cut)
		if eng.FrozenFor() == "" {
			s.frozen.CompareAndDelete(req.Engine, eng)
		}
	}
	if err := s.thawCutFS(req.Engine, req.Cut); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	if _, ok := s.frozen.Load(req.Engine); ok {
		return &impb.Empty{}, nil
	}
	if _, err := s.getEngine(req.Engine); err != nil {
		return nil, engineapi.ToStatus(err)
	}
	return &impb.Empty{}, nil
}

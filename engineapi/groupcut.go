package engineapi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// CutMember is one volume of a group cut: the engine, the instance manager
// running it, and the snapshot to take.
type CutMember struct {
	Client      DataPlane
	Engine      string
	Snapshot    string
	UserCreated bool
	Labels      map[string]string
	// FSFreeze above 0 freezes the volume's filesystem (if staged with one)
	// before its engine, for at most this long (SnapshotCreate's fsFreeze).
	FSFreeze time.Duration
}

// CutResult tells how a cut went: Stall is how long the first engine was
// frozen (writes waited at most that long).
type CutResult struct {
	Stall time.Duration
}

// GroupCut is one crash-consistent cut of several volumes, in phases a
// caller may record between: Freeze, Snapshot, Finish. Every engine was
// frozen at the moment the last freeze began, and each snapshot is taken
// inside its engine's freeze, so no snapshot holds a write acknowledged
// after another member's snapshot point.
type GroupCut struct {
	Name    string
	Members []CutMember
	// Timeout bounds the freeze: an engine thaws on its own after it, so a
	// caller that dies mid-cut stalls writes no longer.
	Timeout time.Duration

	start time.Time
	taken []CutMember
}

// Freeze freezes every member at once.
func (g *GroupCut) Freeze(ctx context.Context) error {
	if len(g.Members) == 0 {
		return fmt.Errorf("group cut %s: no members: %w", g.Name, ErrInvalid)
	}
	g.start = time.Now()
	// A member's filesystem freeze comes first and may take up to its own bound.
	var fsFreeze time.Duration
	for _, m := range g.Members {
		fsFreeze = max(fsFreeze, m.FSFreeze)
	}
	ctx, cancel := context.WithTimeout(ctx, g.Timeout+fsFreeze)
	defer cancel()
	if err := eachMember(g.Members, func(m CutMember) error {
		return m.Client.EngineFreeze(ctx, m.Engine, g.Name, g.Timeout, m.FSFreeze)
	}); err != nil {
		return fmt.Errorf("group cut %s: freeze: %w", g.Name, err)
	}
	return nil
}

// Snapshot takes every member's snapshot inside its freeze, at once; an
// engine whose freeze ended refuses (ErrFreezeLost) and the cut fails.
func (g *GroupCut) Snapshot(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, g.Timeout)
	defer cancel()
	var mu sync.Mutex
	err := eachMember(g.Members, func(m CutMember) error {
		if err := m.Client.SnapshotCreateInCut(ctx, m.Engine, g.Name, m.Snapshot, m.UserCreated, m.Labels); err != nil {
			return err
		}
		mu.Lock()
		g.taken = append(g.taken, m)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("group cut %s: snapshot: %w", g.Name, err)
	}
	return nil
}

// Finish thaws every member (also one whose freeze call failed: it may
// have taken effect) and, if the cut failed (err), removes the snapshots it
// took, once thawed (a frozen engine refuses structural changes): all or
// nothing. It returns err joined with what the cleanup could not do.
func (g *GroupCut) Finish(err error) (CutResult, error) {
	thawAll(g.Name, g.Members)
	res := CutResult{Stall: time.Since(g.start)}
	if err != nil {
		return res, errors.Join(err, removeTaken(g.taken))
	}
	return res, nil
}

// TakeGroupCut takes crash-consistent snapshots of every member: Freeze,
// Snapshot, Finish. Members are frozen and snapshotted in parallel, so the
// stall is about the slowest member's round trips, not their sum.
func TakeGroupCut(ctx context.Context, cut string, members []CutMember, timeout time.Duration) (CutResult, error) {
	g := &GroupCut{Name: cut, Members: members, Timeout: timeout}
	err := g.Freeze(ctx)
	if err == nil {
		err = g.Snapshot(ctx)
	}
	return g.Finish(err)
}

// eachMember runs fn for every member at once and joins their errors.
func eachMember(members []CutMember, fn func(CutMember) error) error {
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(m); err != nil {
				errs[i] = fmt.Errorf("engine %s: %w", m.Engine, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// thawAll thaws every member; a thaw is idempotent.
func thawAll(cut string, members []CutMember) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = eachMember(members, func(m CutMember) error { return m.Client.EngineThaw(ctx, m.Engine, cut) })
}

// removeTaken removes the snapshots a failed cut took, so none is left
// half of a group.
func removeTaken(taken []CutMember) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := eachMember(taken, func(m CutMember) error { return m.Client.SnapshotRemove(ctx, m.Engine, m.Snapshot) })
	if err != nil {
		return fmt.Errorf("removing the snapshots taken: %w", err)
	}
	return nil
}

package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// A group cut: snapshots of several volumes, whose engines may run on
// different nodes, that hold one crash-consistent point of all their write
// streams. The caller freezes every engine of the group (each stops
// acknowledging writes and drains those in flight), then, once all froze,
// takes each snapshot inside its engine's freeze, then thaws them all.
// Every engine was frozen at the instant the last freeze began, and each
// snapshot was taken before its engine thawed, so no snapshot holds a
// write acknowledged after another member's snapshot point: the cut is
// what a crash of all the volumes at that instant would have left.
//
// A freeze ends on its own after its timeout, so a caller that dies (a
// manager killed mid-cut) cannot leave a volume frozen; a snapshot asked
// for after its engine thawed is refused with ErrFreezeLost, and the
// caller removes the members it took (all or nothing).

// ErrFreezeLost: the engine is not frozen for the cut (the freeze timed
// out, was thawed, or never happened).
var ErrFreezeLost = errors.New("engine is not frozen for this cut")

// MaxFreeze bounds a freeze: writes stall for its length at worst.
const MaxFreeze = time.Minute

type freeze struct {
	mu      sync.Mutex             // held while a freeze starts, ends or snapshots
	held    atomic.Pointer[string] // the cut frozen for; nil when none
	began   time.Time
	timer   *time.Timer
	release func() // ends the structural section
}

// Freeze stops the engine acknowledging writes for cut until Thaw(cut) or
// timeout. A second Freeze of the same cut succeeds without extending it;
// another cut's is refused with ErrBusy while one holds.
func (e *Engine) Freeze(ctx context.Context, cut string, timeout time.Duration) error {
	if cut == "" {
		return errors.New("freeze: cut: required")
	}
	if timeout <= 0 || timeout > MaxFreeze {
		return fmt.Errorf("freeze: timeout %v: must be above 0 and at most %v", timeout, MaxFreeze)
	}
	e.fz.mu.Lock()
	defer e.fz.mu.Unlock()
	switch held := e.FrozenFor(); held {
	case cut:
		return nil
	case "":
	default:
		return fmt.Errorf("freeze for cut %s of volume %s: frozen for cut %s: %w", cut, e.volume, held, ErrBusy)
	}
	release, err := e.structural("freeze for cut " + cut)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		release()
		return err
	}
	e.io.Lock() // waits for the I/O in flight; new I/O waits for the thaw
	e.fz.began, e.fz.release = time.Now(), release
	e.fz.held.Store(&cut)
	e.fz.timer = time.AfterFunc(timeout, func() {
		if e.Thaw(cut) {
			e.log.WithField("cut", cut).WithField("timeout", timeout).Warn("Freeze timed out; the engine thawed on its own")
		}
	})
	e.log.WithField("cut", cut).Info("Frozen for a group cut")
	return nil
}

// Thaw ends the freeze of cut; it reports whether one ended (false: none
// held for cut, which is as good: Thaw is idempotent).
func (e *Engine) Thaw(cut string) bool {
	e.fz.mu.Lock()
	defer e.fz.mu.Unlock()
	if cut == "" || e.FrozenFor() != cut {
		return false
	}
	e.fz.timer.Stop()
	e.io.Unlock()
	e.fz.release()
	e.log.WithField("cut", cut).WithField("frozen", time.Since(e.fz.began)).Info("Thawed")
	e.fz.timer, e.fz.release = nil, nil
	e.fz.held.Store(nil)
	return true
}

// FrozenFor is the cut the engine is frozen for, "" if none; it takes no
// lock, so structural changes can refuse at once instead of waiting.
func (e *Engine) FrozenFor() string {
	if p := e.fz.held.Load(); p != nil {
		return *p
	}
	return ""
}

// ThawAny ends whatever freeze holds, before the engine goes away.
func (e *Engine) ThawAny() {
	if cut := e.FrozenFor(); cut != "" {
		e.Thaw(cut)
	}
}

// SnapshotInCut takes a snapshot inside the engine's freeze for cut; the
// freeze cannot end while it runs. Without that freeze it is refused with
// ErrFreezeLost and nothing is taken.
func (e *Engine) SnapshotInCut(ctx context.Context, cut, name string, opts SnapshotOptions) error {
	e.fz.mu.Lock()
	defer e.fz.mu.Unlock()
	if cut == "" || e.FrozenFor() != cut {
		return fmt.Errorf("snapshot %s of volume %s in cut %s: %w", name, e.volume, cut, ErrFreezeLost)
	}
	return e.takeSnapshot(ctx, name, opts, e.log.WithField("cut", cut))
}

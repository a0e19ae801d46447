package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engine/dataconn"
	"github.com/strata-storage/strata/engine/replicactl"
)

// SnapshotOptions describe a snapshot to take.
type SnapshotOptions struct {
	UserCreated bool
	Labels      map[string]string
}

// Snapshot takes a snapshot on every replica at one point in the write
// stream: no I/O is in flight while it runs. It first asks every replica
// whether it would take it (name free, limits), so a refusal refuses the
// snapshot everywhere and fails no replica; a replica that then fails to
// take it has a chain unlike the others and goes ERR.
func (e *Engine) Snapshot(ctx context.Context, name string, opts SnapshotOptions) error {
	release, err := e.structural("snapshot " + name)
	if err != nil {
		return err
	}
	defer release()
	e.io.Lock()
	defer e.io.Unlock()
	return e.takeSnapshot(ctx, name, opts, e.log)
}

// takeSnapshot takes a user's (or a group cut's) snapshot; the caller holds
// e.io exclusively.
func (e *Engine) takeSnapshot(ctx context.Context, name string, opts SnapshotOptions, log logrus.FieldLogger) error {
	// One ID for every replica: layers taken at the same point of the
	// write stream match, so a rebuild can keep a returning replica's.
	args := replicactl.SnapshotArgs{Name: name, UserCreated: opts.UserCreated,
		Created: time.Now().UTC().Truncate(time.Second), Labels: opts.Labels, ID: replicactl.NewLayerID()}
	if err := e.snapshotLocked(ctx, args); err != nil {
		return err
	}
	log.WithField("snapshot", name).Info("Snapshot taken")
	e.onChange()
	return nil
}

// Chain reads the snapshot chain from one RW replica.
func (e *Engine) Chain(ctx context.Context) (replicactl.ChainReply, error) {
	var reply replicactl.ChainReply
	err := e.controlOne(ctx, func(b Backend) error { return b.Control(ctx, replicactl.Chain, nil, &reply) })
	return reply, err
}

// RemoveSnapshot marks a snapshot removed on every replica; purge frees its data.
func (e *Engine) RemoveSnapshot(ctx context.Context, name string) error {
	release, err := e.structural("remove " + name)
	if err != nil {
		return err
	}
	defer release()
	if err := e.requireSnapshot(ctx, name); err != nil {
		return err
	}
	// A purge started by an earlier remove runs in the replicas' background
	// and may merge the layer away between the chain read and this call:
	// gone is as good as removed, not a replica failure (which, on every
	// replica at once, had faulted the volume on a retried delete).
	return e.controlAllWith(ctx, "remove "+name, func(ctx context.Context, b Backend) error {
		err := b.Control(ctx, replicactl.Remove, replicactl.NameArgs{Name: name}, nil)
		if errors.Is(err, dataconn.ErrNotFound) {
			return nil
		}
		return err
	})
}

// Revert puts a new empty head on a snapshot on every replica. The volume
// must have no frontend client; the caller makes sure of that.
func (e *Engine) Revert(ctx context.Context, name string) error {
	release, err := e.structural("revert to " + name)
	if err != nil {
		return err
	}
	defer release()
	if err := e.requireSnapshot(ctx, name); err != nil {
		return err
	}
	return e.controlAll(ctx, "revert to "+name, replicactl.Revert, replicactl.NameArgs{Name: name})
}

// SetLimits sets the snapshot limits on every replica.
func (e *Engine) SetLimits(ctx context.Context, maxCount int, maxSize int64) error {
	return e.controlAll(ctx, "set limits", replicactl.SetLimits, replicactl.LimitsArgs{MaxCount: maxCount, MaxSize: maxSize})
}

// Expand grows the volume on every replica, then the engine.
func (e *Engine) Expand(ctx context.Context, size int64) error {
	release, err := e.structural("expand")
	if err != nil {
		return err
	}
	defer release()
	if size <= e.Size() {
		return fmt.Errorf("new size %d is not larger than the current %d", size, e.Size())
	}
	if err := e.controlAll(ctx, "expand", replicactl.Expand, replicactl.SizeArgs{Size: size}); err != nil {
		return err
	}
	e.mu.Lock()
	e.size = size
	e.mu.Unlock()
	e.onChange()
	return nil
}

// StartPurge starts a purge on every replica; PurgeStatus follows it.
func (e *Engine) StartPurge(ctx context.Context) error {
	release, err := e.structural("purge")
	if err != nil {
		return err
	}
	defer release()
	return e.controlAll(ctx, "purge", replicactl.PurgeStart, nil)
}

// PurgeStatus reports each writer's purge progress.
func (e *Engine) PurgeStatus(ctx context.Context) map[string]replicactl.PurgeStatusReply {
	writers, _, _ := e.targets()
	out := make(map[string]replicactl.PurgeStatusReply, len(writers))
	for _, r := range writers {
		var st replicactl.PurgeStatusReply
		if err := r.backend.Control(ctx, replicactl.PurgeStatus, nil, &st); err != nil {
			st = replicactl.PurgeStatusReply{State: "error", Error: err.Error()}
		}
		out[r.name] = st
	}
	return out
}

func (e *Engine) requireSnapshot(ctx context.Context, name string) error {
	chain, err := e.Chain(ctx)
	if err != nil {
		return err
	}
	if _, ok := chain.Layers[name]; !ok || name == replicactl.HeadName {
		return fmt.Errorf("%w: %s in volume %s", ErrSnapshotNotFound, name, e.volume)
	}
	return nil
}

// snapshotLocked takes args' snapshot on every writer, two-phase: every
// replica is asked first, so a refusal fails none. The caller holds e.io.
func (e *Engine) snapshotLocked(ctx context.Context, args replicactl.SnapshotArgs) error {
	writers, _, _ := e.targets()
	for _, r := range writers {
		if err := r.backend.Control(ctx, replicactl.SnapshotCheck, args, nil); err != nil {
			return fmt.Errorf("snapshot %s refused by replica %s: %w", args.Name, r.name, err)
		}
	}
	return e.fanOutControlLocked(ctx, "snapshot "+args.Name, func(ctx context.Context, b Backend) error {
		return b.Control(ctx, replicactl.Snapshot, args, nil)
	})
}

// controlAll makes one control call on every writer, between two writes.
func (e *Engine) controlAll(ctx context.Context, what, method string, args any) error {
	return e.controlAllWith(ctx, what, func(ctx context.Context, b Backend) error { return b.Control(ctx, method, args, nil) })
}

// controlAllWith is controlAll with the call on each writer given whole.
func (e *Engine) controlAllWith(ctx context.Context, what string, call func(context.Context, Backend) error) error {
	e.io.Lock()
	defer e.io.Unlock()
	if err := e.fanOutControlLocked(ctx, what, call); err != nil {
		return err
	}
	e.onChange()
	return nil
}

// fanOutControlLocked runs a change every replica must make on every
// writer; the caller holds e.io. The caller's cancellation does not reach
// the calls: a change cut off part-way because the caller went away (a
// manager killed while its gRPC request ran) would mark healthy replicas
// ERR and rebuild them for nothing. The data connection's own timeout still
// bounds each call.
func (e *Engine) fanOutControlLocked(ctx context.Context, what string, call func(context.Context, Backend) error) error {
	ctx = context.WithoutCancel(ctx)
	return e.fanOutLocked(what, func(r *replica) error { return call(ctx, r.backend) })
}

// controlOne makes a read-only control call on one RW replica, falling back
// to the next on failure.
func (e *Engine) controlOne(ctx context.Context, call func(Backend) error) error {
	_, readers, _ := e.targets()
	if len(readers) == 0 {
		return ErrNoHealthyReplica
	}
	var lastErr error
	for _, r := range readers {
		if lastErr = call(r.backend); lastErr == nil {
			return nil
		}
	}
	return lastErr
}

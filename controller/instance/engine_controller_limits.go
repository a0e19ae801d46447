package instance

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// EventReasonEngineSnapshotLimits tells an admin that a running engine took
// new limits on user snapshots.
const EventReasonEngineSnapshotLimits = "SnapshotLimitsSet"

// wantSnapshotLimits are the limits on user snapshots the engine's spec
// asks for (the volume controller copies them from the volume).
func wantSnapshotLimits(e *v1beta1.Engine) v1beta1.EngineSnapshotLimits {
	return v1beta1.EngineSnapshotLimits{MaxCount: e.Spec.SnapshotMaxCount, MaxSize: e.Spec.SnapshotMaxSize}
}

// snapshotLimitsPending tells whether the running engine may hold other
// limits than its spec's: status.snapshotLimits records what was last set
// (the instance manager does not report them), and is unset when it must
// be set again.
func snapshotLimitsPending(e *v1beta1.Engine) bool {
	return e.Status.SnapshotLimits == nil || *e.Status.SnapshotLimits != wantSnapshotLimits(e)
}

// applySnapshotLimits sets the spec's limits on the running engine and all
// its replicas when they differ from what it was last given: a volume's
// snapshotMaxCount or snapshotMaxSize changed while it runs, or a replica
// joined. A replica instance starts without limits and a rebuild does not
// pass them on, so without this a volume whose replicas were all rebuilt
// would take user snapshots past its limit. The record is in the CR, so a
// restarted manager does not set them again.
func (c *EngineController) applySnapshotLimits(ctx context.Context, client engineapi.DataPlane, e *v1beta1.Engine) error {
	if !snapshotLimitsPending(e) {
		return nil
	}
	want, was := wantSnapshotLimits(e), e.Status.SnapshotLimits
	if err := client.SnapshotLimitsSet(ctx, e.Name, want.MaxCount, want.MaxSize); err != nil {
		return fmt.Errorf("setting snapshot limits (%d snapshots, %d bytes) on engine %s: %w", want.MaxCount, want.MaxSize, e.Name, err)
	}
	e.Status.SnapshotLimits = &want
	c.Logger.WithFields(map[string]any{"engine": e.Name, "volume": e.Spec.VolumeName,
		"maxCount": want.MaxCount, "maxSize": want.MaxSize}).Info("Set snapshot limits")
	if was != nil { // a change, not the first setting or one after a replica joined
		c.Recorder.Eventf(e, corev1.EventTypeNormal, EventReasonEngineSnapshotLimits, "user snapshot limits now %s (were %s)",
			describeSnapshotLimits(want), describeSnapshotLimits(*was))
	}
	return nil
}

func describeSnapshotLimits(l v1beta1.EngineSnapshotLimits) string {
	count, size := "no count limit", "no size limit"
	if l.MaxCount > 0 {
		count = fmt.Sprintf("at most %d", l.MaxCount)
	}
	if l.MaxSize > 0 {
		size = fmt.Sprintf("at most %d bytes", l.MaxSize)
	}
	return count + ", " + size
}

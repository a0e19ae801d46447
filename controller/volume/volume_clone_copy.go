package volume

import (
	"context"

	"github.com/sirupsen/logrus"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// The copy itself is one SnapshotClone call that lasts as long as the data
// takes, so it runs beside the workers, not in one: a worker would be held
// for minutes. Its outcome is handed back to the next sync of the target.
// A manager restarted mid-copy forgets it (the instance manager cancels the
// call with the connection); the next sync starts it over, and the data
// plane zeroes the half-filled target first.

// copyOutcome is how a copy ended.
type copyOutcome struct {
	err  error
	seen bool // a sync has applied it already
}

// runCopy starts the copy into engine of target t in the background, unless
// a copy runs or has ended since the sync looked: the check and the start
// are one step under the lock, because a copy that ended in between would
// otherwise be started over (the data plane zeroes the target first) while
// the next sync releases the volume on the first copy's outcome.
func (c *VolumeCloneController) runCopy(t *v1beta1.Volume, client engineapi.DataPlane, args engineapi.SnapshotCloneArgs) bool {
	c.mu.Lock()
	_, running := c.copies[t.UID]
	_, ended := c.results[t.UID]
	if running || ended {
		c.mu.Unlock()
		return false
	}
	ctx, cancel := context.WithTimeout(c.runCtx, cloneTimeout)
	c.copies[t.UID] = cancel
	c.mu.Unlock()
	key := t.Namespace + "/" + t.Name
	log := c.Logger.WithFields(logrus.Fields{"volume": t.Name, "engine": args.Engine, "source": args.SourceAddress,
		"snapshot": args.Snapshot, "backingShared": args.BackingShared})
	log.Info("Clone copy started")
	go func() {
		defer cancel()
		err := client.SnapshotClone(ctx, args)
		if err != nil {
			log.WithError(err).Warn("Clone copy failed")
		} else {
			log.Info("Clone copy completed")
		}
		c.mu.Lock()
		delete(c.copies, t.UID)
		c.results[t.UID] = copyOutcome{err: err}
		c.mu.Unlock()
		c.Queue.Add(key)
	}()
	return true
}

func (c *VolumeCloneController) copyRunning(t *v1beta1.Volume) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.copies[t.UID]
	return ok
}

// copyResult is a finished copy's outcome; it stays until forgetResult.
// seen tells an outcome handed out before (its event is not repeated).
func (c *VolumeCloneController) copyResult(t *v1beta1.Volume) (err error, finished, seen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, finished := c.results[t.UID]
	if !finished {
		return nil, false, false
	}
	seen = r.seen
	r.seen = true
	c.results[t.UID] = r
	return r.err, true, seen
}

// forgetResult drops an outcome the volume's status now records.
func (c *VolumeCloneController) forgetResult(t *v1beta1.Volume) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.results, t.UID)
}

// cancelCopy stops a copy into a volume being deleted.
func (c *VolumeCloneController) cancelCopy(t *v1beta1.Volume) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cancel, ok := c.copies[t.UID]; ok {
		cancel()
	}
	delete(c.results, t.UID)
}

package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// A run lasts as long as its snapshots and backups take, so it goes on
// beside the workers, as a clone's copy does (volume_clone_copy.go), and
// hands its outcome to the job's next sync. Every wait in it is bounded:
// a snapshot not ready in defaultRecurringSnapshotWait fails that volume;
// a backup not finished in defaultRecurringBackupWait is left to the
// backup controller, and a later run's retention counts it once Completed.
const (
	defaultRecurringSnapshotWait = 2 * time.Minute
	defaultRecurringBackupWait   = 10 * time.Minute
	defaultRecurringPollInterval = time.Second
)

// jobRun is one run of a job by this manager.
type jobRun struct {
	uid    k8stypes.UID
	tick   time.Time
	cancel context.CancelFunc
	// done is set when the run ended; outcome then says how.
	done     bool
	outcome  runOutcome
	reported bool // its event was recorded
}

// runOutcome is how a run ended.
type runOutcome struct {
	finishedAt time.Time
	volumes    int
	err        error
}

// startRun runs job's task for tick in the background; its end enqueues
// the job.
func (c *RecurringJobController) startRun(key string, job *v1beta1.RecurringJob, tick time.Time) {
	c.mu.Lock()
	ctx, cancel := context.WithCancel(c.runCtx)
	r := &jobRun{uid: job.UID, tick: tick, cancel: cancel}
	if old := c.runs[key]; old != nil && old.cancel != nil {
		old.cancel()
	}
	c.runs[key] = r
	c.mu.Unlock()
	log := c.Logger.WithFields(logrus.Fields{"recurringJob": job.Name, "task": job.Spec.Task,
		"tick": tick.Format(time.RFC3339)})
	c.Recorder.Eventf(job, corev1.EventTypeNormal, EventReasonRecurringJobStarted, "%s run of tick %s started",
		job.Spec.Task, tick.Format(time.RFC3339))
	go func() {
		defer cancel()
		out := c.runJob(ctx, log, job, tick)
		c.mu.Lock()
		r.done, r.outcome = true, out
		current := c.runs[key] == r
		c.mu.Unlock()
		if current {
			c.Queue.Add(key)
		}
	}()
}

// cancelRun stops this manager's run of a job deleted or taken over by
// another manager, and forgets it.
func (c *RecurringJobController) cancelRun(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.runs[key]; r != nil {
		r.cancel()
		delete(c.runs, key)
	}
}

// runJob runs the task on every selected volume, at most
// spec.concurrency at once, and says how it went.
func (c *RecurringJobController) runJob(ctx context.Context, log logrus.FieldLogger, job *v1beta1.RecurringJob,
	tick time.Time) runOutcome {
	volumes, err := c.selectVolumes(job)
	if err != nil {
		return runOutcome{finishedAt: c.DS.Clock.Now(), err: err}
	}
	log.WithField("volumes", len(volumes)).Info("Recurring job run started")
	if job.Spec.Task == v1beta1.RecurringJobTaskSnapshotGroup {
		// One cut of them all, not a task per volume.
		err := c.groupTask(ctx, job, volumes, tick)
		if ctx.Err() != nil {
			err = errRunCancelled
		}
		return runOutcome{finishedAt: c.DS.Clock.Now(), volumes: len(volumes), err: err}
	}
	slots := make(chan struct{}, max(1, int(job.Spec.Concurrency)))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, vol := range volumes {
		wg.Go(func() {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-slots }()
			if err := c.runTask(ctx, job, vol, tick); err != nil {
				log.WithField("volume", vol.Name).WithError(err).Warn("Recurring job failed on a volume")
				mu.Lock()
				errs = append(errs, fmt.Errorf("volume %s: %w", vol.Name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		errs = append(errs, errRunCancelled)
	}
	out := runOutcome{finishedAt: c.DS.Clock.Now(), volumes: len(volumes), err: errors.Join(errs...)}
	log.WithFields(logrus.Fields{"volumes": out.volumes, "failed": len(errs)}).Info("Recurring job run ended")
	return out
}

// selectVolumes lists the volumes the job runs on, by name: those labelled
// with the job, or with one of its groups (volumes without recurring-job
// labels are in group default). Volumes being deleted, and volumes still
// being filled by a clone or a restore, are left out: they have no data of
// their own to keep yet.
func (c *RecurringJobController) selectVolumes(job *v1beta1.RecurringJob) ([]*v1beta1.Volume, error) {
	keys := []string{types.RecurringJobSelectorKey(job.Name)}
	for _, g := range job.Spec.Groups {
		keys = append(keys, types.RecurringJobGroupSelectorKey(g))
	}
	byName := map[string]*v1beta1.Volume{}
	for _, k := range keys {
		vols, err := c.DS.Volumes.ListByIndexRO(datastore.IndexByRecurringJob, k)
		if err != nil {
			return nil, fmt.Errorf("listing the volumes of %s: %w", k, err)
		}
		for _, v := range vols {
			if kit.VolumeSettled(v) {
				byName[v.Name] = v
			}
		}
	}
	out := make([]*v1beta1.Volume, 0, len(byName))
	for _, v := range byName {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *v1beta1.Volume) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// waitFor polls the cache until done says so, ctx ends or timeout passes.
func (c *RecurringJobController) waitFor(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, c.pollInterval, timeout, true, func(context.Context) (bool, error) {
		return done()
	})
}

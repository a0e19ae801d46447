package backup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const (
	EventReasonRecurringJobStarted   = "RecurringJobStarted"
	EventReasonRecurringJobCompleted = "RecurringJobCompleted"
	EventReasonRecurringJobFailed    = "RecurringJobFailed"
	EventReasonRecurringJobInvalid   = "InvalidSchedule"

	// ConditionTypeScheduled is True while the job's cron parses and the
	// job waits for its next tick or runs.
	ConditionTypeScheduled = "Scheduled"
)

// syncRecurringJob decides, for the job's owner, what the job does now:
// record a finished run's outcome, start the run of a due tick (once, for
// the latest tick missed), and sleep until the next tick. A job with no
// tick due and nothing new costs no write: only its AddAfter.
func (c *RecurringJobController) syncRecurringJob(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return nil
	}
	jobRO, err := c.DS.RecurringJobs.GetRO(name)
	if apierrors.IsNotFound(err) || (err == nil && jobRO.DeletionTimestamp != nil) {
		c.cancelRun(key)
		return nil
	}
	if err != nil {
		return err
	}
	// Jobs have no node; one alive manager owns each, the recorded owner
	// while it lives (ownership.go).
	responsible, err := c.IsResponsibleFor(key, jobRO.Status.OwnerID, "")
	if err != nil {
		return err
	}
	if !responsible {
		c.cancelRun(key) // another manager took the job over
		return nil
	}
	job := jobRO.DeepCopy()
	job.Status.OwnerID = c.ControllerID
	schedule, err := cron.ParseStandard(job.Spec.Cron)
	if err != nil {
		c.setScheduled(job, metav1.ConditionFalse, EventReasonRecurringJobInvalid,
			fmt.Sprintf("spec.cron %q: %v", job.Spec.Cron, err))
		// Nothing to wait for: a new spec brings the job back.
		return c.writeJobStatus(ctx, jobRO, job)
	}
	c.setScheduled(job, metav1.ConditionTrue, "Scheduled", "")
	outcome, running := c.applyOutcome(key, job)
	if running {
		// The run's end enqueues the job again.
		return c.writeJobStatus(ctx, jobRO, job)
	}
	now := c.DS.Clock.Now()
	tick, due := dueTick(schedule, tickBase(job), now)
	if !due {
		if err := c.writeJobStatus(ctx, jobRO, job); err != nil {
			return err
		}
		c.forgetOutcome(key, outcome)
		c.sleepUntil(key, tick, now)
		return nil
	}
	return c.startTick(ctx, key, job, tick, outcome)
}

// startTick records the tick, then starts its run.
//
// The tick is written before the run starts, in the same status write that
// records the previous run's outcome: a manager that dies mid-run comes
// back (or is replaced) with this tick already taken and waits for the
// next, so no tick runs twice. The price is that a run cut short by a crash
// is not redone — the next tick's run makes its snapshots and backups, and
// retention counts the whole ones. A write that fails (a conflict with a
// spec edit, a lost owner) starts nothing and the sync is retried.
func (c *RecurringJobController) startTick(ctx context.Context, key string, job *v1beta1.RecurringJob,
	tick time.Time, outcome *runOutcome) error {
	job.Status.LastScheduledAt = metav1.NewTime(tick)
	job.Status.ExecutionCount++
	updated, err := c.DS.RecurringJobs.UpdateStatus(ctx, job)
	if err != nil {
		return fmt.Errorf("recurring job %s: recording tick %s: %w", job.Name, tick.Format(time.RFC3339), err)
	}
	c.forgetOutcome(key, outcome)
	c.startRun(key, updated, tick)
	return nil
}

// tickBase is the time the next tick is counted from: the last tick run,
// or, for a new job, its creation (its first tick is the first after it).
func tickBase(job *v1beta1.RecurringJob) time.Time {
	if !job.Status.LastScheduledAt.IsZero() {
		return job.Status.LastScheduledAt.Time
	}
	return job.CreationTimestamp.Time
}

// sleepUntil brings the job back at its next tick; a schedule with no
// next tick (none within five years) never comes back on its own.
func (c *RecurringJobController) sleepUntil(key string, next, now time.Time) {
	if next.IsZero() {
		return
	}
	c.Queue.AddAfter(key, next.Sub(now))
}

// applyOutcome writes a finished run's outcome into job's status and
// returns it (nil when there is none); running tells a run still going.
func (c *RecurringJobController) applyOutcome(key string, job *v1beta1.RecurringJob) (*runOutcome, bool) {
	c.mu.Lock()
	r := c.runs[key]
	c.mu.Unlock()
	if r == nil || r.uid != job.UID {
		return nil, false
	}
	if !r.done {
		return nil, true
	}
	out := &r.outcome
	job.Status.LastRunAt = metav1.NewTime(out.finishedAt)
	job.Status.LastRunVolumes = int32(out.volumes)
	job.Status.LastRunError = ""
	if out.err != nil {
		job.Status.LastRunError = truncateMessage(out.err.Error())
	}
	if !r.reported {
		r.reported = true
		c.reportOutcome(job, r)
	}
	return out, false
}

func (c *RecurringJobController) reportOutcome(job *v1beta1.RecurringJob, r *jobRun) {
	tick := r.tick.Format(time.RFC3339)
	if r.outcome.err != nil {
		c.Recorder.Eventf(job, corev1.EventTypeWarning, EventReasonRecurringJobFailed, "%s run of tick %s on %d volumes: %s",
			job.Spec.Task, tick, r.outcome.volumes, job.Status.LastRunError)
		return
	}
	c.Recorder.Eventf(job, corev1.EventTypeNormal, EventReasonRecurringJobCompleted, "%s run of tick %s done on %d volumes",
		job.Spec.Task, tick, r.outcome.volumes)
}

// forgetOutcome drops a run's outcome once the job's status holds it.
func (c *RecurringJobController) forgetOutcome(key string, out *runOutcome) {
	if out == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.runs[key]; r != nil && &r.outcome == out {
		delete(c.runs, key)
	}
}

// setScheduled sets the Scheduled condition; the transition time moves
// only when the status does, so a steady job is never rewritten.
func (c *RecurringJobController) setScheduled(job *v1beta1.RecurringJob, status metav1.ConditionStatus, reason, msg string) {
	if status == metav1.ConditionFalse {
		if cond := meta.FindStatusCondition(job.Status.Conditions, ConditionTypeScheduled); cond == nil || cond.Message != msg {
			c.Recorder.Event(job, corev1.EventTypeWarning, reason, msg)
		}
	}
	meta.SetStatusCondition(&job.Status.Conditions, metav1.Condition{Type: ConditionTypeScheduled, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: job.Generation,
		LastTransitionTime: metav1.NewTime(c.DS.Clock.Now())})
}

func (c *RecurringJobController) writeJobStatus(ctx context.Context, before, job *v1beta1.RecurringJob) error {
	if equality.Semantic.DeepEqual(before.Status, job.Status) {
		return nil
	}
	if _, err := c.DS.RecurringJobs.UpdateStatus(ctx, job); err != nil {
		return fmt.Errorf("recurring job %s: writing status: %w", job.Name, err)
	}
	return nil
}

// maxRunErrorLen keeps lastRunError readable when many volumes failed.
const maxRunErrorLen = 1024

func truncateMessage(msg string) string {
	if len(msg) <= maxRunErrorLen {
		return msg
	}
	return msg[:maxRunErrorLen] + "…"
}

var errRunCancelled = errors.New("run cancelled")

package backup

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Garbage collection of a backup target in the cluster (issue 15): the
// manager that polls a target also collects it, on its own queue so a long
// GC never delays a poll, after a Backup's deletion removed a manifest and
// every backup-gc-interval. The backup controller asks for a GC by stamping
// AnnotationBackupGCRequestedAt on the BackupTarget: the deleting manager is
// often not the target's owner, and the annotation reaches the owner through
// its informer, survives its restart, and costs one write per deletion.
// Safety against a concurrent backup is the backupstore's (inflight markers,
// index objects deleted before packs); this side adds the cluster's own
// records, without which an empty listing is never swept.

const (
	// AnnotationBackupGCRequestedAt on a BackupTarget asks its owner for a
	// GC; any new value is a new request.
	AnnotationBackupGCRequestedAt = "strata.io/backup-gc-requested-at"

	// ConditionTypeGarbageCollected says how the last GC of a target went.
	ConditionTypeGarbageCollected = "GarbageCollected"
	BackupTargetReasonGCCollected = "Collected"
	BackupTargetReasonGCDeferred  = "Deferred"
	BackupTargetReasonGCFailed    = "Failed"

	EventReasonGarbageCollected          = "GarbageCollected"
	EventReasonGarbageCollectionDeferred = "GarbageCollectionDeferred"
	EventReasonGarbageCollectionFailed   = "GarbageCollectionFailed"

	// backupGCTimeout bounds one GC: it reads every manifest of the target.
	backupGCTimeout = 30 * time.Minute
	// maxBackupDuration is how long a backup's inflight marker may go
	// unrefreshed before GC takes it for a crashed backup's (backups refresh
	// theirs every 5 minutes).
	maxBackupDuration = time.Hour
)

// gcMemory is what this manager remembers of a target's GCs.
type gcMemory struct {
	lastRun time.Time
	// handled is the AnnotationBackupGCRequestedAt value last acted on.
	handled string
}

// gcPlan is what the cluster's records say about a GC of a target.
type gcPlan struct {
	// confirmEmpty: no Backup of the target is recorded, so an empty
	// listing may be swept.
	confirmEmpty bool
	// why ConfirmEmpty is not set, said if the listing turns out empty.
	blocker string
}

// planBackupGC reads the cluster's Backup records of the target at url.
// ConfirmEmpty needs the target to have been listed (the mirror has made a
// CR of every backup it found) and no Backup of it that is Completed and not
// being deleted (a deleting one's manifest is gone or going) or still being
// taken (it may write its manifest any moment; a Backup not yet given a URL
// will go to this target). Pure, so it is table-tested.
func planBackupGC(bt *v1beta1.BackupTarget, backups []*v1beta1.Backup) gcPlan {
	if bt.Status.LastSyncedAt.IsZero() {
		return gcPlan{blocker: "the target has not been listed yet, so the cluster's records of it are not known"}
	}
	url := bt.Spec.BackupTargetURL
	var completed, taking []string
	for _, b := range backups {
		switch {
		case b.Status.URL != "" && b.Status.URL != url:
		case b.Status.State == v1beta1.BackupStateCompleted && b.DeletionTimestamp == nil && b.Status.URL == url:
			completed = append(completed, b.Name)
		case !kit.BackupFinished(b) && b.DeletionTimestamp == nil:
			taking = append(taking, b.Name)
		}
	}
	switch {
	case len(taking) > 0:
		return gcPlan{blocker: fmt.Sprintf("backup %s is in progress", strings.Join(taking, ", "))}
	case len(completed) > 0:
		return gcPlan{blocker: fmt.Sprintf("the cluster records %d completed backups of the target (%s)",
			len(completed), strings.Join(completed, ", "))}
	}
	return gcPlan{confirmEmpty: true}
}

// gcDue says whether a GC should run now (asked for, or the interval
// passed since the last one) and, if not, how long until it should.
// interval 0 turns the periodic GC off; a first sight of a target runs one.
func gcDue(mem gcMemory, requested string, interval time.Duration, now time.Time) (bool, time.Duration) {
	if requested != "" && requested != mem.handled {
		return true, 0
	}
	if interval <= 0 {
		return false, 0
	}
	if mem.lastRun.IsZero() {
		return true, 0
	}
	if wait := mem.lastRun.Add(interval).Sub(now); wait > 0 {
		return false, wait
	}
	return true, 0
}

// syncBackupTargetGC runs a target's GC when it is due, records how it
// went, and sets the timer for the next one: a quiet target costs one queue
// add per interval and nothing else.
func (c *BackupTargetController) syncBackupTargetGC(ctx context.Context, key string) error {
	name, err := kit.NameFromKey(key)
	if err != nil {
		return err
	}
	btRO, err := c.DS.BackupTargets.GetRO(name)
	if apierrors.IsNotFound(err) {
		c.forgetGC(key)
		return nil
	}
	if err != nil {
		return err
	}
	if responsible, err := c.IsResponsibleFor(key, btRO.Status.OwnerID, ""); err != nil || !responsible {
		return err // the new owner's queue has the key (requeueOnNodeReadyChange)
	}
	interval, err := c.settingMinutes(types.SettingBackupGCInterval)
	if err != nil {
		return err
	}
	now := c.DS.Clock.Now()
	requested := btRO.Annotations[AnnotationBackupGCRequestedAt]
	mem := c.gcMemoryOf(key)
	due, wait := gcDue(mem, requested, interval, now)
	if !due {
		if wait > 0 {
			c.gcQueue.AddAfter(key, wait)
		}
		return nil
	}
	if !btRO.Status.Available {
		// A GC would fail the same way the poll does; the target turning
		// available enqueues the key again.
		return nil
	}
	rep, plan, gcErr := c.collect(ctx, btRO)
	c.rememberGC(key, gcMemory{lastRun: now, handled: requested})
	if err := c.recordGC(ctx, btRO, rep, plan, gcErr); err != nil {
		return err
	}
	if interval > 0 {
		c.gcQueue.AddAfter(key, interval)
	}
	return nil
}

// collect runs one GC of the target with the cluster's records.
func (c *BackupTargetController) collect(ctx context.Context, bt *v1beta1.BackupTarget) (*backupstore.GCReport, gcPlan, error) {
	backups, err := c.DS.Backups.ListRO(nil)
	if err != nil {
		return nil, gcPlan{}, err
	}
	plan := planBackupGC(bt, backups)
	grace, err := c.settingMinutes(types.SettingBackupGCGrace)
	if err != nil {
		return nil, plan, err
	}
	if grace <= 0 {
		grace = time.Nanosecond // GCOptions takes 0 for its 24 h default
	}
	callCtx, cancel := context.WithTimeout(ctx, backupGCTimeout)
	defer cancel()
	secret, err := targetCredentials(callCtx, c.DS, bt)
	if err != nil {
		return nil, plan, err
	}
	store, err := c.storeFor(bt.Spec.BackupTargetURL, secret)
	if err != nil {
		return nil, plan, err
	}
	tgt, err := backupstore.Open(callCtx, store, backupstore.Options{Logger: c.Logger})
	if err != nil {
		return nil, plan, err
	}
	rep, err := tgt.GC(callCtx, backupstore.GCOptions{Grace: grace, MaxBackupDuration: maxBackupDuration,
		ConfirmEmpty: plan.confirmEmpty})
	return rep, plan, err
}

// errEmptyListing tells the backupstore's refusal to sweep an empty listing.
func errEmptyListing(err error) bool {
	return err != nil && strings.Contains(err.Error(), "refusing to delete anything on an empty listing")
}

// recordGC says how a GC went: a structured log line always, an event when
// something was deleted, deferred or failed (a quiet hourly run that found
// nothing writes nothing), and the GarbageCollected condition when its
// status or message changed.
func (c *BackupTargetController) recordGC(ctx context.Context, btRO *v1beta1.BackupTarget, rep *backupstore.GCReport,
	plan gcPlan, gcErr error) error {
	log := c.Logger.WithField("backupTarget", btRO.Name)
	if rep != nil {
		log = log.WithFields(logrus.Fields{"manifests": rep.Manifests, "packs": rep.Packs, "packsReferenced": rep.PacksReferenced,
			"packsYoung": rep.PacksYoung, "packsDeleted": rep.PacksDeleted, "bytesDeleted": rep.BytesDeleted,
			"bytesKept": rep.BytesKept, "indexesDeleted": rep.IndexesDeleted, "markersDeleted": rep.MarkersDeleted,
			"missingPacks": len(rep.MissingPacks), "confirmEmpty": plan.confirmEmpty})
	}
	var reason, msg string
	switch {
	case errEmptyListing(gcErr):
		reason = BackupTargetReasonGCDeferred
		msg = fmt.Sprintf("the target lists no backup and %s: nothing swept (%v)", plan.blocker, gcErr)
		log.Warn("Backup target GC deferred: " + msg)
		c.Recorder.Event(btRO, corev1.EventTypeWarning, EventReasonGarbageCollectionDeferred, msg)
	case gcErr != nil:
		reason, msg = BackupTargetReasonGCFailed, gcErr.Error()
		log.WithError(gcErr).Warn("Backup target GC failed")
		c.Recorder.Event(btRO, corev1.EventTypeWarning, EventReasonGarbageCollectionFailed, msg)
	case rep.Deferred != "":
		reason = BackupTargetReasonGCDeferred
		msg = fmt.Sprintf("%s; %d packs (%d bytes) deleted", rep.Deferred, rep.PacksDeleted, rep.BytesDeleted)
		log.WithField("deferred", rep.Deferred).Info("Backup target GC deferred")
		c.Recorder.Event(btRO, corev1.EventTypeWarning, EventReasonGarbageCollectionDeferred, msg)
	default:
		reason = BackupTargetReasonGCCollected
		msg = fmt.Sprintf("%d packs (%d bytes) deleted; %d packs referenced by %d backups, %d unreferenced kept within the grace",
			rep.PacksDeleted, rep.BytesDeleted, rep.PacksReferenced, rep.Manifests, rep.PacksYoung)
		if len(rep.MissingPacks) > 0 {
			// Not GC's doing, but a restore of these backups will fail:
			// say so where an admin looks.
			msg += fmt.Sprintf("; %d referenced packs are missing, first %s", len(rep.MissingPacks), rep.MissingPacks[0])
		}
		log.Info("Backup target garbage collected")
		if rep.PacksDeleted > 0 || rep.IndexesDeleted > 0 || rep.MarkersDeleted > 0 {
			c.Recorder.Event(btRO, corev1.EventTypeNormal, EventReasonGarbageCollected, msg)
		}
	}
	status := metav1.ConditionTrue
	if reason != BackupTargetReasonGCCollected {
		status = metav1.ConditionFalse
	}
	return c.setGCCondition(ctx, btRO, metav1.Condition{Type: ConditionTypeGarbageCollected, Status: status,
		Reason: reason, Message: msg, ObservedGeneration: btRO.Generation,
		LastTransitionTime: metav1.NewTime(c.DS.Clock.Now().Truncate(time.Second))})
}

// setGCCondition writes the condition unless the target already has it. It
// reads the target live on a conflict: the poll writes the same status.
func (c *BackupTargetController) setGCCondition(ctx context.Context, btRO *v1beta1.BackupTarget, cond metav1.Condition) error {
	same := func(bt *v1beta1.BackupTarget) bool {
		was := meta.FindStatusCondition(bt.Status.Conditions, cond.Type)
		return was != nil && was.Status == cond.Status && was.Reason == cond.Reason && was.Message == cond.Message &&
			was.ObservedGeneration == cond.ObservedGeneration
	}
	if same(btRO) {
		return nil
	}
	bt := btRO.DeepCopy()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !meta.SetStatusCondition(&bt.Status.Conditions, cond) && same(bt) {
			return nil
		}
		_, err := c.DS.BackupTargets.UpdateStatus(ctx, bt)
		if apierrors.IsConflict(err) {
			if live, gerr := c.DS.BackupTargets.GetLive(ctx, bt.Name); gerr == nil {
				bt = live
			}
		}
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup target %s: recording its GC: %w", btRO.Name, err)
	}
	return nil
}

func (c *BackupTargetController) settingMinutes(name types.SettingName) (time.Duration, error) {
	n, err := c.DS.GetSettingInt(name)
	if err != nil {
		return 0, err
	}
	return time.Duration(n) * time.Minute, nil
}

func (c *BackupTargetController) gcMemoryOf(key string) gcMemory {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gcRuns[key]
}

func (c *BackupTargetController) rememberGC(key string, m gcMemory) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gcRuns[key] = m
}

func (c *BackupTargetController) forgetGC(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.gcRuns, key)
}

// requestBackupTargetGC asks the target's owner for a GC (a Backup's
// manifest was deleted): a new AnnotationBackupGCRequestedAt.
func requestBackupTargetGC(ctx context.Context, ds *datastore.DataStore, btRO *v1beta1.BackupTarget) error {
	bt := btRO.DeepCopy()
	if bt.Annotations == nil {
		bt.Annotations = map[string]string{}
	}
	bt.Annotations[AnnotationBackupGCRequestedAt] = ds.Clock.Now().UTC().Format(time.RFC3339Nano)
	if _, err := ds.BackupTargets.Update(ctx, bt); err != nil {
		return fmt.Errorf("asking for a GC of backup target %s: %w", bt.Name, err)
	}
	return nil
}

// gcKeysChanged tells a BackupTarget update the GC queue must see: a new
// request, or the target turning available (a GC waits for that).
func gcKeysChanged(o, n *v1beta1.BackupTarget) bool {
	return o.Annotations[AnnotationBackupGCRequestedAt] != n.Annotations[AnnotationBackupGCRequestedAt] ||
		(!o.Status.Available && n.Status.Available)
}

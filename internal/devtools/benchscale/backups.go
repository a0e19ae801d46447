package benchscale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

const (
	// benchTarget is the BackupTarget every Backup goes to (the backup
	// controller's DefaultBackupTargetName).
	benchTarget = "default"
	// targetPollInterval is longer than any run: the target controller
	// lists the store at creation and then only every spec.pollInterval,
	// and each poll is a queue add and a status write (lastSyncedAt), by
	// design. A poll in the quiet window would be the target doing the job
	// it was asked to do, not a cost of holding the objects; the default
	// (5 minutes) would fall in it, a step or two after the target is made.
	targetPollInterval = 24 * time.Hour
	// benchJob is a RecurringJob that must stay asleep: its cron's next
	// tick is next New Year, and its group is on no volume.
	benchJob      = "bench-never"
	benchJobCron  = "0 0 1 1 *"
	benchJobGroup = "bench-no-volume-has-this-group"
)

func backupName(i int) string  { return fmt.Sprintf("bench-backup-%03d", i) }
func restoreName(i int) string { return fmt.Sprintf("bench-restore-%03d", i) }

// backupQueues are the workqueues of the backup controllers (the names
// their kit.NewBaseController and AddQueue give); the quiet window reports
// each, even at 0, so a renamed queue shows as absent rather than as quiet.
var backupQueues = []string{"strata-backup-target", "strata-backup-target-gc", "strata-backup",
	"strata-volume-restore", "strata-recurring-job"}

// backupResources are the strata.io resources those controllers write.
var backupResources = []string{"backuptargets", "backupvolumes", "backups", "recurringjobs"}

// stepBackups brings the backup controllers into the quiet window: a
// file:// BackupTarget on a directory of the run, -backups Backups of
// existing bench snapshots (timed until every one is Completed), -restores
// new volumes filled from them (timed until restored and detached again),
// and a RecurringJob that never fires. The quiet window then holds a
// settled target, completed backups, restored volumes and a sleeping job,
// which must cost nothing.
func (b *bench) stepBackups(ctx context.Context) error {
	n := min(b.cfg.backups, b.cfg.volumes*b.cfg.snapshots)
	if n == 0 {
		b.log.Info("-backups 0 (or no snapshots): no backup step")
		return nil
	}
	if err := b.createTarget(ctx); err != nil {
		return err
	}
	if err := b.takeBackups(ctx, n); err != nil {
		return err
	}
	if err := b.pollTarget(ctx, min(n, b.cfg.volumes)); err != nil {
		return err
	}
	if err := b.restoreBackups(ctx, min(b.cfg.restores, n)); err != nil {
		return err
	}
	return b.createSleepingJob(ctx)
}

// createTarget makes the BackupTarget default on runDir/backups, the
// instance managers' --backup-path (a file:// target needs no credential
// Secret) and waits until it is Available.
func (b *bench) createTarget(ctx context.Context) error {
	dir := b.opts.BackupDir()
	// Backups are volume data: the owner's only, as the store keeps them.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	start := time.Now()
	bt := &v1beta1.BackupTarget{ObjectMeta: metav1.ObjectMeta{Name: benchTarget, Namespace: ns},
		Spec: v1beta1.BackupTargetSpec{BackupTargetURL: "file://" + dir,
			PollInterval: metav1.Duration{Duration: targetPollInterval}}}
	if err := retryCreate(ctx, "create backup target", func() error {
		_, err := b.strata.StrataV1beta1().BackupTargets(ns).Create(ctx, bt, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	var msg string
	if _, err := b.waitCount(ctx, "backup target available", 1, func() int {
		got, err := b.strata.StrataV1beta1().BackupTargets(ns).Get(ctx, benchTarget, metav1.GetOptions{})
		if err != nil {
			msg = err.Error()
			return 0
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, "Available"); c != nil {
			msg = c.Reason + ": " + c.Message
		}
		if got.Status.Available {
			return 1
		}
		return 0
	}, func() string { return msg }); err != nil {
		return err
	}
	b.info("file:// backup target Available", fmtDur(time.Since(start)))
	return nil
}

// takeBackups backs up n bench snapshots, the i-th of volume i mod V, so
// the jobs are spread over the engines (every bench volume is attached,
// so no backup needs a ticket of its own), and waits until all are
// Completed.
func (b *bench) takeBackups(ctx context.Context, n int) error {
	v := b.cfg.volumes
	start := time.Now()
	err := parallel(ctx, n, b.cfg.workers, func(ctx context.Context, i int) error {
		bk := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: backupName(i), Namespace: ns},
			Spec: v1beta1.BackupSpec{SnapshotName: snapshotName(i%v, (i/v)%b.cfg.snapshots)}}
		return retryCreate(ctx, "create backup "+bk.Name, func() error {
			_, err := b.strata.StrataV1beta1().Backups(ns).Create(ctx, bk, metav1.CreateOptions{})
			return err
		})
	})
	if err != nil {
		return err
	}
	created := time.Since(start)
	var failed []string
	var pending string
	finished := func() int {
		list, err := b.strata.StrataV1beta1().Backups(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return 0
		}
		done, out, bad := 0, []string{}, []string{}
		for _, bk := range list.Items {
			if !strings.HasPrefix(bk.Name, "bench-backup-") {
				continue
			}
			switch bk.Status.State {
			case v1beta1.BackupStateCompleted:
				done++
			case v1beta1.BackupStateError:
				done++
				bad = append(bad, fmt.Sprintf("%s: %s", bk.Name, bk.Status.Error))
			default:
				out = append(out, fmt.Sprintf("%s: state=%q progress=%d error=%q", bk.Name, bk.Status.State,
					bk.Status.Progress, bk.Status.Error))
			}
		}
		slices.Sort(out)
		failed, pending = bad, fmt.Sprintf("%d backups not finished, for example: %s", len(out),
			strings.Join(out[:min(5, len(out))], "; "))
		return done
	}
	if _, err := b.waitCount(ctx, "backups completed", n, finished, func() string { return pending }); err != nil {
		return err
	}
	if len(failed) > 0 {
		slices.Sort(failed)
		return fmt.Errorf("%d of %d backups failed, for example: %s", len(failed), n, strings.Join(failed[:min(5, len(failed))], "; "))
	}
	took := time.Since(start)
	b.log.WithFields(logrus.Fields{"backups": n, "created": fmtDur(created), "completed": fmtDur(took)}).Info("backups completed")
	b.info(fmt.Sprintf("create %d Backups of bench snapshots", n), fmtDur(created))
	b.info("  … all Completed (from first create)", fmt.Sprintf("%s (%.1f backups/s)", fmtDur(took),
		float64(n)/took.Seconds()))
	return nil
}

// pollTarget has the target controller list the store once more, now that
// it holds the backups, by a spec edit (the poll interval one minute
// longer): the mirror makes a BackupVolume for each of the volumes backed
// up and must find every Backup CR already as the backup controller wrote
// it. What that poll wrote is reported by resource; the quiet window then
// holds the BackupVolumes too.
func (b *bench) pollTarget(ctx context.Context, volumes int) error {
	if _, err := b.waitDrained(ctx, 5*time.Minute); err != nil && !errors.Is(err, errNotDrained) {
		return err
	}
	_, w0, err := b.scrapeBoth(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	patch := fmt.Sprintf(`{"spec":{"pollInterval":%q}}`, (targetPollInterval + time.Minute).String())
	if err := retry(ctx, "edit the backup target", func() error {
		_, err := b.strata.StrataV1beta1().BackupTargets(ns).Patch(ctx, benchTarget, k8stypes.MergePatchType,
			[]byte(patch), metav1.PatchOptions{})
		return err
	}); err != nil {
		return err
	}
	count := func() int {
		list, err := b.strata.StrataV1beta1().BackupVolumes(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return 0
		}
		n := 0
		for _, bv := range list.Items {
			if bv.Status.LastBackupName != "" {
				n++
			}
		}
		return n
	}
	if _, err := b.waitCount(ctx, "backup volumes mirrored", volumes, count, func() string {
		return fmt.Sprintf("%d of %d BackupVolumes with a last backup", count(), volumes)
	}); err != nil {
		return err
	}
	took := time.Since(start)
	if _, err := b.waitDrained(ctx, 5*time.Minute); err != nil && !errors.Is(err, errNotDrained) {
		return err
	}
	_, w1, err := b.scrapeBoth(ctx)
	if err != nil {
		return err
	}
	writes := map[string]float64{}
	for k, v := range w1.minus(w0) {
		if r, ok := strings.CutPrefix(k, "strata.io/"); ok {
			writes[r] = v
		}
	}
	b.log.WithFields(logrus.Fields{"took": fmtDur(took), "strataWrites": fmtCounts(writes)}).Info("backup target polled")
	b.info(fmt.Sprintf("a poll of the target after the backups: %d BackupVolumes mirrored", volumes), fmtDur(took))
	b.info("  … strata.io writes of that poll (the bench's edit included)", fmtCounts(writes))
	return nil
}

// restoreBackups fills n new volumes from the first n backups and waits
// until every restore is completed and its volume detached again (the
// restore controller gives its ticket back): the quiet window holds
// finished restores.
func (b *bench) restoreBackups(ctx context.Context, n int) error {
	if n == 0 {
		b.log.Info("-restores 0: no restores")
		return nil
	}
	start := time.Now()
	err := parallel(ctx, n, b.cfg.workers, func(ctx context.Context, i int) error {
		vol := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: restoreName(i), Namespace: ns},
			Spec: v1beta1.VolumeSpec{Size: b.cfg.size, NumberOfReplicas: int32(b.cfg.replicas),
				Frontend: v1beta1.VolumeFrontendNBD, FromBackup: backupName(i)}}
		return retryCreate(ctx, "create volume "+vol.Name, func() error {
			_, err := b.strata.StrataV1beta1().Volumes(ns).Create(ctx, vol, metav1.CreateOptions{})
			return err
		})
	})
	if err != nil {
		return err
	}
	// When the bench's informer first saw each restore completed (100 ms
	// resolution, from the count's polls).
	var mu sync.Mutex
	completedAt := map[string]time.Duration{}
	var failed []string
	isRestore := func(v *v1beta1.Volume) bool { return strings.HasPrefix(v.Name, "bench-restore-") }
	count := func() int {
		vols, _ := b.volumes.List(labels.Everything())
		mu.Lock()
		defer mu.Unlock()
		done := 0
		failed = failed[:0]
		for _, v := range vols {
			if !isRestore(v) || v.Status.RestoreStatus == nil {
				continue
			}
			switch v.Status.RestoreStatus.State {
			case v1beta1.VolumeRestoreStateCompleted:
				if _, ok := completedAt[v.Name]; !ok {
					completedAt[v.Name] = time.Since(start)
				}
				if v.Status.State == v1beta1.VolumeStateDetached {
					done++
				}
			case v1beta1.VolumeRestoreStateFailed:
				done++
				failed = append(failed, fmt.Sprintf("%s: %s", v.Name, v.Status.RestoreStatus.Message))
			}
		}
		return done
	}
	describe := func() string {
		vols, _ := b.volumes.List(labels.Everything())
		var out []string
		for _, v := range vols {
			if isRestore(v) && (v.Status.RestoreStatus == nil || v.Status.State != v1beta1.VolumeStateDetached ||
				v.Status.RestoreStatus.State != v1beta1.VolumeRestoreStateCompleted) {
				rs := v1beta1.VolumeRestoreStatus{}
				if v.Status.RestoreStatus != nil {
					rs = *v.Status.RestoreStatus
				}
				out = append(out, fmt.Sprintf("%s: state=%q restore=%q progress=%d message=%q", v.Name, v.Status.State,
					rs.State, rs.Progress, rs.Message))
			}
		}
		slices.Sort(out)
		return fmt.Sprintf("%d restores not done, for example: %s", len(out), strings.Join(out[:min(5, len(out))], "; "))
	}
	if _, err := b.waitCount(ctx, "restores completed and detached", n, count, describe); err != nil {
		return err
	}
	took := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		slices.Sort(failed)
		return fmt.Errorf("%d of %d restores failed, for example: %s", len(failed), n, strings.Join(failed[:min(5, len(failed))], "; "))
	}
	times := make([]time.Duration, 0, len(completedAt))
	for _, d := range completedAt {
		times = append(times, d)
	}
	slices.Sort(times)
	b.log.WithFields(logrus.Fields{"restores": n, "p50": fmtDur(percentile(times, 0.5)), "max": fmtDur(times[len(times)-1]),
		"detached": fmtDur(took)}).Info("restores completed")
	b.info(fmt.Sprintf("restore %d volumes from backups: completed, p50 / max (from first create)", n),
		fmtDur(percentile(times, 0.5))+" / "+fmtDur(times[len(times)-1]))
	b.info("  … all restored and detached", fmtDur(took))
	return nil
}

// createSleepingJob makes a RecurringJob whose next tick is next New Year
// and whose group no volume has, and waits until a manager owns it and has
// scheduled it (its one status write): asleep, it must cost nothing.
func (b *bench) createSleepingJob(ctx context.Context) error {
	job := &v1beta1.RecurringJob{ObjectMeta: metav1.ObjectMeta{Name: benchJob, Namespace: ns},
		Spec: v1beta1.RecurringJobSpec{Task: v1beta1.RecurringJobTaskSnapshot, Cron: benchJobCron, Retain: 1,
			Concurrency: 1, Groups: []string{benchJobGroup}}}
	start := time.Now()
	if err := retryCreate(ctx, "create recurring job", func() error {
		_, err := b.strata.StrataV1beta1().RecurringJobs(ns).Create(ctx, job, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	var msg string
	if _, err := b.waitCount(ctx, "recurring job scheduled", 1, func() int {
		got, err := b.strata.StrataV1beta1().RecurringJobs(ns).Get(ctx, benchJob, metav1.GetOptions{})
		if err != nil {
			msg = err.Error()
			return 0
		}
		c := meta.FindStatusCondition(got.Status.Conditions, "Scheduled")
		msg = fmt.Sprintf("owner %q, condition %+v", got.Status.OwnerID, c)
		if got.Status.OwnerID != "" && c != nil && c.Status == metav1.ConditionTrue {
			return 1
		}
		return 0
	}, func() string { return msg }); err != nil {
		return err
	}
	b.info(fmt.Sprintf("RecurringJob %q (never due, no volume in its group) scheduled", benchJobCron), fmtDur(time.Since(start)))
	return nil
}

// reportBackupQuiet adds the quiet window's figures for the backup
// controllers alone: adds per queue (each named, 0 included; a queue no
// manager exposes is "absent") and strata.io writes per backup resource.
func (b *bench) reportBackupQuiet(window string, before, after managerMetrics, writes apiWrites) {
	if min(b.cfg.backups, b.cfg.volumes*b.cfg.snapshots) == 0 {
		return
	}
	var adds []string
	total, absent := 0.0, false
	for _, q := range backupQueues {
		if _, ok := after.addsByQueue[q]; !ok {
			adds = append(adds, q+"=absent")
			absent = true
			continue
		}
		d := after.addsByQueue[q] - before.addsByQueue[q]
		total += d
		adds = append(adds, fmt.Sprintf("%s=%g", q, d))
	}
	b.check("workqueue adds of the backup controllers in "+window, strings.Join(adds, " "), "0", total == 0 && !absent)
	var ws []string
	totalW := 0.0
	for _, r := range backupResources {
		d := writes["strata.io/"+r]
		totalW += d
		ws = append(ws, fmt.Sprintf("%s=%g", r, d))
	}
	b.check("API writes of backup objects (strata.io) in "+window, strings.Join(ws, " "), "0", totalW == 0)
}

package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	stypes "github.com/strata-storage/strata/types"
)

// recurringTarget starts an S3 server and makes it the default target;
// it returns the target as the test reads it.
func recurringTarget(t *testing.T, prefix string) *backupstore.Target {
	t.Helper()
	tgt, _ := defaultS3Target(t, prefix)
	return tgt
}

// fastCron is the schedule of the e2e jobs: robfig/cron's descriptor
// runs them every 15 s, and their objects' names carry the tick's seconds,
// so a test sees five ticks in a little over a minute, not in five minutes.
const fastCron = "@every 15s"

// createRecurringJob creates a job on cron keeping 3; it goes, with the
// backups it made (deleted from the target while it is there), when the
// test ends.
func createRecurringJob(t *testing.T, name string, task v1beta1.RecurringJobTask, cron string) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		_, err := env.adminStrata.StrataV1beta1().RecurringJobs(ns).Create(ctx, &v1beta1.RecurringJob{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1beta1.RecurringJobSpec{Task: task, Cron: cron, Retain: 3, Concurrency: 2,
				Labels: map[string]string{"e2e": "recurring"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Logf("create recurring job %s: %v", name, err)
		}
		return err == nil
	}, 30*time.Second, 500*time.Millisecond)
	t.Cleanup(func() {
		_ = env.adminStrata.StrataV1beta1().RecurringJobs(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = env.adminStrata.StrataV1beta1().Backups(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: stypes.LabelRecurringJob + "=" + name})
	})
}

func getJob(t *testing.T, name string) *v1beta1.RecurringJob {
	t.Helper()
	j, err := env.adminStrata.StrataV1beta1().RecurringJobs(ns).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return j
}

// waitRunsEnded waits until the job has run at least runs ticks and its
// last run has ended without error.
func waitRunsEnded(t *testing.T, name string, runs int64, timeout time.Duration) *v1beta1.RecurringJob {
	t.Helper()
	var j *v1beta1.RecurringJob
	require.Eventually(t, func() bool {
		j = getJob(t, name)
		return j.Status.ExecutionCount >= runs && !j.Status.LastRunAt.Before(&j.Status.LastScheduledAt)
	}, timeout, time.Second, "job %s ran %d ticks", name, runs)
	assert.Empty(t, j.Status.LastRunError, "job %s's last run", name)
	return j
}

// jobObjects lists the names of the job's snapshots (ready ones) and
// Completed backups of volume.
func jobObjects(t *testing.T, job, volume string) (snaps, backups []string) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: stypes.LabelRecurringJob + "=" + job + "," + stypes.LabelVolume + "=" + volume}
	sl, err := env.adminStrata.StrataV1beta1().Snapshots(ns).List(ctx, sel)
	require.NoError(t, err)
	for _, s := range sl.Items {
		if s.Status.ReadyToUse && s.DeletionTimestamp == nil {
			snaps = append(snaps, s.Name)
		}
	}
	bl, err := env.adminStrata.StrataV1beta1().Backups(ns).List(ctx, sel)
	require.NoError(t, err)
	for _, b := range bl.Items {
		if b.Status.State == v1beta1.BackupStateCompleted && b.DeletionTimestamp == nil {
			backups = append(backups, b.Name)
		}
	}
	return snaps, backups
}

func targetBackupsOf(t *testing.T, tgt *backupstore.Target, volume string) []string {
	t.Helper()
	infos, err := tgt.ListBackups(context.Background())
	require.NoError(t, err)
	var out []string
	for _, i := range infos {
		if i.Volume == volume {
			out = append(out, i.Backup)
		}
	}
	return out
}

func labelledFor(jobs ...string) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Labels = map[string]string{}
		for _, j := range jobs {
			v.Labels[stypes.RecurringJobVolumeLabel(j)] = stypes.RecurringJobLabelEnabled
		}
	}
}

// A snapshot job and a backup job, every 15 s with retain 3, on two
// volumes being written at the same pace: after 4 ticks each
// volume holds exactly 3 of each job's snapshots and 3 Completed backups,
// and the target lists
// exactly 3 backups of it. Renamed (the same job under a new name, the old
// deleted), the old job's snapshots go with one kubectl command and the
// new job's stay (seed snapshot-crd, story 1).
func testRecurringJobRetainAndRename(t *testing.T) {
	tgt := recurringTarget(t, "e2e-rj")
	const snapJob, backupJob, groupJob, renamed = "e2e-rj-snap", "e2e-rj-bk", "e2e-rj-grp", "e2e-rj-snap-v2"
	vols := []string{"e2e-rj-a", "e2e-rj-b"}
	var endpoints []string
	for _, vol := range vols {
		createVolume(t, vol, "64Mi", 1, labelledFor(snapJob, backupJob, groupJob))
	}
	for _, vol := range vols {
		waitVolume(t, vol, time.Minute, "detached", isDetached)
		updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
		endpoints = append(endpoints, waitVolume(t, vol, time.Minute, "attached", attachedTo("node-1")).Status.FrontendEndpoint)
	}
	createRecurringJob(t, snapJob, v1beta1.RecurringJobTaskSnapshot, fastCron)
	createRecurringJob(t, backupJob, v1beta1.RecurringJobTaskBackup, fastCron)
	createRecurringJob(t, groupJob, v1beta1.RecurringJobTaskSnapshotGroup, fastCron)

	// New data between ticks, so each backup has something of its own.
	stop := make(chan struct{})
	var writers sync.WaitGroup
	writers.Go(func() {
		for i := 0; ; i++ {
			for _, ep := range endpoints {
				// A lost write would leave a backup with nothing new.
				if _, err := runQemuIO(ep, "write -P "+strconv.Itoa(1+i%200)+" "+strconv.Itoa(i%32)+"M 1M"); err != nil {
					t.Errorf("write %d to %s: %v", i, ep, err)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Second):
			}
		}
	})
	defer func() { close(stop); writers.Wait() }()

	start := time.Now()
	// Four runs: one more than the 3 kept, so each job has pruned.
	waitRunsEnded(t, snapJob, 4, 3*time.Minute)
	waitRunsEnded(t, backupJob, 4, 2*time.Minute)
	waitRunsEnded(t, groupJob, 4, time.Minute)
	t.Logf("4 ticks of each job in %s", time.Since(start).Round(time.Second))
	// The group job: one crash-consistent cut of both volumes a tick, 3 kept.
	require.Eventually(t, func() bool {
		groups, err := env.adminStrata.StrataV1beta1().SnapshotGroups(ns).List(context.Background(),
			metav1.ListOptions{LabelSelector: stypes.LabelRecurringJob + "=" + groupJob})
		require.NoError(t, err)
		ready := 0
		for _, g := range groups.Items {
			if g.Status.State == v1beta1.SnapshotGroupReady && g.DeletionTimestamp == nil && len(g.Status.Snapshots) == len(vols) {
				ready++
			}
		}
		t.Logf("%d groups of %s, %d Ready with both volumes", len(groups.Items), groupJob, ready)
		return ready == 3 && len(groups.Items) == 3
	}, 40*time.Second, 2*time.Second, "job %s keeps exactly 3 groups", groupJob)
	for _, vol := range vols {
		require.Eventually(t, func() bool {
			s1, _ := jobObjects(t, snapJob, vol)
			s2, b2 := jobObjects(t, backupJob, vol)
			onTarget := targetBackupsOf(t, tgt, vol)
			t.Logf("%s: %d snapshots of %s, %d snapshots and %d Completed backups of %s, %d backups on the target",
				vol, len(s1), snapJob, len(s2), len(b2), backupJob, len(onTarget))
			return len(s1) == 3 && len(s2) == 3 && len(b2) == 3 && len(onTarget) == 3
		}, 40*time.Second, 2*time.Second, "volume %s keeps exactly 3 of each", vol)
	}

	// Rename: the same job under a new name, the volumes relabelled, the
	// old job deleted. Its snapshots stay until the admin prunes them.
	createRecurringJob(t, renamed, v1beta1.RecurringJobTaskSnapshot, fastCron)
	for _, vol := range vols {
		_, err := env.adminStrata.StrataV1beta1().Volumes(ns).Patch(context.Background(), vol, "application/merge-patch+json",
			[]byte(`{"metadata":{"labels":{"`+stypes.RecurringJobVolumeLabel(snapJob)+`":null,"`+
				stypes.RecurringJobVolumeLabel(renamed)+`":"enabled"}}}`), metav1.PatchOptions{})
		require.NoError(t, err)
	}
	kubectl(t, "-n", ns, "delete", "rj", snapJob)
	waitRunsEnded(t, renamed, 1, 3*time.Minute)
	out := kubectl(t, "-n", ns, "delete", "snap", "-l", stypes.LabelRecurringJob+"="+snapJob)
	assert.Equal(t, 2*3, strings.Count(out, "deleted"), "kubectl deleted the old job's 3 snapshots of each volume: %s", out)
	for _, vol := range vols {
		require.Eventually(t, func() bool {
			old, _ := jobObjects(t, snapJob, vol)
			return len(old) == 0
		}, time.Minute, time.Second, "the old job's snapshots of %s are gone", vol)
		kept, _ := jobObjects(t, renamed, vol)
		assert.NotEmpty(t, kept, "the new job's snapshots of %s stay", vol)
		// The backup job still runs: a tick's snapshot and backup are a
		// fourth until that run prunes the oldest, so look for the 3 kept.
		require.Eventually(t, func() bool {
			s2, b2 := jobObjects(t, backupJob, vol)
			return len(s2) == 3 && len(b2) == 3
		}, 45*time.Second, time.Second, "the backup job's 3 snapshots and 3 backups of %s stay", vol)
	}
}

// kubectl's columns of a job that never runs during the test (its cron is
// next due on 1 January), so that nothing moves while they are read.
func TestRecurringJobColumns(t *testing.T) {
	t.Parallel()
	const job = "e2e-rj-columns"
	createRecurringJob(t, job, v1beta1.RecurringJobTaskSnapshot, "0 0 1 1 *")
	assert.Regexp(t, `NAME\s+TASK\s+CRON\s+RETAIN\s+LASTRUN\s+AGE\n`+job+`\s+snapshot\s+0 0 1 1 \*\s+3\s`,
		kubectl(t, "-n", ns, "get", "rj", job))
}

// kill -9 of the manager that owns a backup job while the job's backup
// uploads: the job converges — an alive manager owns it, later ticks run,
// no tick ran twice (no snapshot of the job was made twice, and each tick
// recorded was counted once), every backup of the job ends, and retention
// holds at 3. In the long tier: make test's recurring jobs are
// TestDefaultBackupTargetUsers/RecurringJobRetainAndRename's.
func TestLongRecurringJobSurvivesOwnerKill(t *testing.T) {
	_, _, tgt := throttledS3Target(t, "e2e-rj-kill", faultRate)
	const job, vol = "e2e-rj-kill", "e2e-rj-k"
	createVolume(t, vol, "64Mi", 1, labelledFor(job))
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	v := waitVolume(t, vol, time.Minute, "attached", attachedTo("node-1"))
	writeRandom(t, v.Status.FrontendEndpoint, faultDataMiB)

	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: stypes.LabelRecurringJob + "=" + job}
	snapWatch, err := env.adminStrata.StrataV1beta1().Snapshots(ns).Watch(ctx, sel)
	require.NoError(t, err)
	defer snapWatch.Stop()
	jobWatch, err := env.adminStrata.StrataV1beta1().RecurringJobs(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + job})
	require.NoError(t, err)
	defer jobWatch.Stop()
	var (
		mu           sync.Mutex
		snapsAdded   = map[string]int{}
		countsOfTick = map[string]map[int64]bool{}
	)
	go func() {
		for ev := range snapWatch.ResultChan() {
			if s, ok := ev.Object.(*v1beta1.Snapshot); ok && ev.Type == watch.Added {
				mu.Lock()
				snapsAdded[s.Name]++
				mu.Unlock()
			}
		}
	}()
	go func() {
		for ev := range jobWatch.ResultChan() {
			if j, ok := ev.Object.(*v1beta1.RecurringJob); ok && !j.Status.LastScheduledAt.IsZero() {
				tick := j.Status.LastScheduledAt.UTC().Format(time.RFC3339)
				mu.Lock()
				if countsOfTick[tick] == nil {
					countsOfTick[tick] = map[int64]bool{}
				}
				countsOfTick[tick][j.Status.ExecutionCount] = true
				mu.Unlock()
			}
		}
	}()
	createRecurringJob(t, job, v1beta1.RecurringJobTaskBackup, fastCron)

	// The first run's backup is full (faultDataMiB through the throttle):
	// kill its owner while it uploads.
	var uploading string
	require.Eventually(t, func() bool {
		bl, err := env.adminStrata.StrataV1beta1().Backups(ns).List(ctx, sel)
		if err != nil {
			return false
		}
		for _, b := range bl.Items {
			if b.Status.State == v1beta1.BackupStateInProgress {
				uploading = b.Name
				return true
			}
		}
		return false
	}, 3*time.Minute, 50*time.Millisecond, "the job's first backup uploads")
	owner := getJob(t, job).Status.OwnerID
	require.NotEmpty(t, owner)
	countAtKill := getJob(t, job).Status.ExecutionCount
	t.Logf("killing %s, owner of %s, while backup %s uploads (run %d)", owner, job, uploading, countAtKill)
	killAndRestartManager(t, owner)

	// Converged: two more ticks run to their end after the restart.
	j := waitRunsEnded(t, job, countAtKill+2, 3*time.Minute)
	t.Logf("after the kill: owner %s, %d runs", j.Status.OwnerID, j.Status.ExecutionCount)
	assert.Contains(t, nodeNames, j.Status.OwnerID)
	b := waitBackupEnded(t, uploading)
	t.Logf("the backup uploading at the kill ended %s %s", b.Status.State, b.Status.Error)
	require.Eventually(t, func() bool {
		snaps, backups := jobObjects(t, job, vol)
		onTarget := targetBackupsOf(t, tgt, vol)
		t.Logf("%d snapshots, %d Completed backups, %d on the target", len(snaps), len(backups), len(onTarget))
		return len(snaps) <= 3 && len(backups) <= 3 && len(onTarget) == len(backups) && len(backups) >= 2
	}, time.Minute, 2*time.Second, "retention holds after the kill")
	bl, err := env.adminStrata.StrataV1beta1().Backups(ns).List(ctx, sel)
	require.NoError(t, err)
	for _, b := range bl.Items {
		if b.Name != uploading {
			assert.Equal(t, v1beta1.BackupStateCompleted, b.Status.State, "backup %s of a later tick", b.Name)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	for name, n := range snapsAdded {
		assert.Equal(t, 1, n, "snapshot %s was made once", name)
	}
	for tick, counts := range countsOfTick {
		assert.Len(t, counts, 1, "tick %s was counted once: %v", tick, counts)
	}
	assert.GreaterOrEqual(t, len(countsOfTick), int(countAtKill)+2)
	t.Logf("%d snapshots made over %d ticks", len(snapsAdded), len(countsOfTick))
}

// Long tier (make test-long): a real five-field cron ticks on the minute.
// make test runs every job on fastCron instead, through the same
// scheduling code (robfig/cron's Schedule.Next).
func TestLongRecurringJobMinuteTick(t *testing.T) {
	const job, vol = "e2e-rj-minute", "e2e-rj-m"
	createVolume(t, vol, "16Mi", 1, labelledFor(job))
	waitVolume(t, vol, time.Minute, "detached", isDetached)
	updateTickets(t, vol, addTicket("admin", v1beta1.AttacherTypeStrataAPI, "node-1"))
	waitVolume(t, vol, time.Minute, "attached", attachedTo("node-1"))
	createRecurringJob(t, job, v1beta1.RecurringJobTaskSnapshot, "* * * * *")
	j := waitRunsEnded(t, job, 2, 3*time.Minute)
	assert.Zero(t, j.Status.LastScheduledAt.Second(), "a minute tick falls on second 0: %s", j.Status.LastScheduledAt)
	snaps, _ := jobObjects(t, job, vol)
	require.NotEmpty(t, snaps)
	for _, s := range snaps {
		assert.Regexp(t, `^`+job+`-`+vol+`-\d{8}-\d{4}00-[0-9a-f]{6}$`, s, "named for its minute")
	}
}

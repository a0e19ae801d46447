package backup

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// at is a time on the test clock's day (dstest.Now is 12:00:00 UTC).
func at(hhmmss string) time.Time {
	t, err := time.Parse("15:04:05", hhmmss)
	if err != nil {
		panic(err)
	}
	n := dstest.Now
	return time.Date(n.Year(), n.Month(), n.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC)
}

func testJob(name string, task v1beta1.RecurringJobTask, cronSpec string, retain int32, mut ...func(*v1beta1.RecurringJob)) *v1beta1.RecurringJob {
	j := &v1beta1.RecurringJob{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fixture.NS, UID: k8stypes.UID("uid-" + name), Generation: 1,
			CreationTimestamp: metav1.NewTime(at("09:00:00"))},
		Spec: v1beta1.RecurringJobSpec{Task: task, Cron: cronSpec, Retain: retain, Concurrency: 2},
	}
	for _, m := range mut {
		m(j)
	}
	return j
}

// steady is a job this manager (node-1) owns, scheduled, last run for tick last.
func steady(last string, count int64) func(*v1beta1.RecurringJob) {
	return func(j *v1beta1.RecurringJob) {
		j.Status.OwnerID, j.Status.ExecutionCount = "node-1", count
		j.Status.LastScheduledAt = metav1.NewTime(at(last))
		j.Status.Conditions = []metav1.Condition{{Type: ConditionTypeScheduled, Status: metav1.ConditionTrue,
			Reason: "Scheduled", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(at("09:00:00"))}}
	}
}

func jobOwnedBy(node string) func(*v1beta1.RecurringJob) {
	return func(j *v1beta1.RecurringJob) { j.Status.OwnerID = node }
}

func newRecurringJobController(t *testing.T, env *dstest.Env, rec record.EventRecorder, me string,
	dp engineapi.Connector) *RecurringJobController {
	t.Helper()
	c, err := NewRecurringJobController(logrus.New(), env.DS, rec, me, dp)
	require.NoError(t, err)
	c.snapshotWait, c.backupWait, c.pollInterval = 5*time.Second, 5*time.Second, 5*time.Millisecond
	return c
}

func recurringJobSyncFunc(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
	c, err := NewRecurringJobController(logrus.New(), env.DS, rec, me, dp)
	if err != nil {
		return nil, err
	}
	return c.syncRecurringJob, nil
}

func jobOf(t *testing.T, env *dstest.Env, name string) *v1beta1.RecurringJob {
	t.Helper()
	j, err := env.Strata.StrataV1beta1().RecurringJobs(fixture.NS).Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return j
}

func wantTick(name, tick string, count int64) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		j := jobOf(t, env, name)
		assert.Equal(t, at(tick), j.Status.LastScheduledAt.UTC(), "lastScheduledAt")
		assert.Equal(t, count, j.Status.ExecutionCount, "executionCount")
		assert.Equal(t, "node-1", j.Status.OwnerID)
	}
}

// The sync of one job: when a tick is due, which one, who owns the job, and
// that a quiet job is not written. No volume is selected (job "j" has no
// volumes), so a started run writes nothing the table would see.
func TestRecurringJobSync(t *testing.T) {
	snapshotJob := func(cronSpec string, mut ...func(*v1beta1.RecurringJob)) *v1beta1.RecurringJob {
		return testJob("j", v1beta1.RecurringJobTaskSnapshot, cronSpec, 3, mut...)
	}
	key := fixture.NS + "/j"
	cases := []fixture.SyncCase{
		{Name: "no tick due: nothing written", Key: key,
			Objects:    fixture.WithNodes(snapshotJob("*/5 * * * *", steady("12:00:00", 4))),
			WantWrites: nil},
		{Name: "the tick of now is due: run once", Key: key,
			Objects:    fixture.WithNodes(snapshotJob("*/5 * * * *", steady("11:55:00", 4))),
			WantWrites: []string{"update recurringjobs/status j"}, WantEvents: []string{"Normal RecurringJobStarted"},
			Check: wantTick("j", "12:00:00", 5)},
		{Name: "ticks missed while every manager was down: one run, for the latest", Key: key,
			Objects:    fixture.WithNodes(snapshotJob("7 * * * *", steady("09:07:00", 4))),
			WantWrites: []string{"update recurringjobs/status j"}, WantEvents: []string{"Normal RecurringJobStarted"},
			Check: wantTick("j", "11:07:00", 5)},
		{Name: "a new job's first tick is the first after its creation", Key: key,
			Objects: fixture.WithNodes(snapshotJob("30 * * * *", func(j *v1beta1.RecurringJob) {
				j.CreationTimestamp, j.Status.OwnerID = metav1.NewTime(at("11:30:00")), "node-1"
			})),
			WantWrites: []string{"update recurringjobs/status j"}, // the condition only: 11:30 is not after 11:30
			Check: func(t *testing.T, env *dstest.Env) {
				j := jobOf(t, env, "j")
				assert.True(t, j.Status.LastScheduledAt.IsZero())
				assert.Zero(t, j.Status.ExecutionCount)
				assert.Equal(t, "node-1", j.Status.OwnerID)
			}},
		{Name: "a new job created before a tick runs it", Key: key,
			Objects: fixture.WithNodes(snapshotJob("0 * * * *", func(j *v1beta1.RecurringJob) {
				j.CreationTimestamp, j.Status.OwnerID = metav1.NewTime(at("11:59:59")), "node-1"
			})),
			WantWrites: []string{"update recurringjobs/status j"}, WantEvents: []string{"Normal RecurringJobStarted"},
			Check: wantTick("j", "12:00:00", 1)},
		{Name: "an alive owner keeps the job", Key: key,
			Objects:    fixture.WithNodes(snapshotJob("*/5 * * * *", steady("11:55:00", 4), jobOwnedBy("node-2"))),
			WantWrites: nil},
		{Name: "a dead owner's job goes to the survivor the hash picks", Key: key,
			Me:         kit.ResponsibleNode(key, "", "", []string{"node-1", "node-2"}),
			Kube:       []runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)},
			Objects:    fixture.WithNodes(snapshotJob("*/5 * * * *", steady("11:50:00", 4), jobOwnedBy("node-3"))),
			WantWrites: []string{"update recurringjobs/status j"}, WantEvents: []string{"Normal RecurringJobStarted"},
			Check: func(t *testing.T, env *dstest.Env) {
				j := jobOf(t, env, "j")
				assert.Equal(t, kit.ResponsibleNode(key, "", "", []string{"node-1", "node-2"}), j.Status.OwnerID)
				assert.Equal(t, at("12:00:00"), j.Status.LastScheduledAt.UTC(), "the latest of the two missed")
				assert.EqualValues(t, 5, j.Status.ExecutionCount)
			}},
		{Name: "the other survivor leaves it alone", Key: key,
			Me:         otherOf(kit.ResponsibleNode(key, "", "", []string{"node-1", "node-2"}), "node-1", "node-2"),
			Kube:       []runtime.Object{fixture.Lease("node-1", 0), fixture.Lease("node-2", 0)},
			Objects:    fixture.WithNodes(snapshotJob("*/5 * * * *", steady("11:50:00", 4), jobOwnedBy("node-3"))),
			WantWrites: nil},
		{Name: "a cron that does not parse: condition and event, no run", Key: key,
			Objects:    fixture.WithNodes(snapshotJob("61 * * * *", steady("11:50:00", 4))),
			WantWrites: []string{"update recurringjobs/status j"}, WantEvents: []string{"Warning InvalidSchedule"},
			Check: func(t *testing.T, env *dstest.Env) {
				j := jobOf(t, env, "j")
				require.Len(t, j.Status.Conditions, 1)
				assert.Equal(t, metav1.ConditionFalse, j.Status.Conditions[0].Status)
				assert.Contains(t, j.Status.Conditions[0].Message, `spec.cron "61 * * * *": `)
				assert.EqualValues(t, 4, j.Status.ExecutionCount)
			}},
		{Name: "a job gone: nothing", Key: fixture.NS + "/gone", WantWrites: nil},
	}
	fixture.RunSyncCases(t, cases, recurringJobSyncFunc)
}

func inDefaultGroup(j *v1beta1.RecurringJob) {
	j.Spec.Groups = []string{types.RecurringJobDefaultGroup}
}

func otherOf(n string, a, b string) string {
	if n == a {
		return b
	}
	return a
}

// A run's outcome comes back to the next sync, which records it with the
// next tick's wait; a second sync with nothing new writes nothing.
func TestRecurringJobRecordsOutcome(t *testing.T) {
	vol := fixture.Volume()
	env := dstest.New(t, fixture.WithNodes(vol, testJob("j", v1beta1.RecurringJobTaskSnapshot, "*/5 * * * *", 3, steady("11:55:00", 4),
		inDefaultGroup)),
		[]runtime.Object{fixture.Lease("node-1", 0)})
	markTakenOnCreate(env)
	rec := record.NewFakeRecorder(20)
	c := newRecurringJobController(t, env, rec, "node-1", fixture.NewFakeConnector(nil))
	key := fixture.NS + "/j"
	require.NoError(t, c.syncRecurringJob(context.Background(), key))
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.runs[key] != nil && c.runs[key].done
	}, 10*time.Second, 10*time.Millisecond)
	// The cache must hold the tick's write before the next sync reads it.
	require.Eventually(t, func() bool {
		j, err := env.DS.RecurringJobs.GetRO("j")
		return err == nil && j.Status.ExecutionCount == 5
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, c.syncRecurringJob(context.Background(), key))
	j := jobOf(t, env, "j")
	assert.Equal(t, int32(1), j.Status.LastRunVolumes)
	assert.Empty(t, j.Status.LastRunError)
	assert.False(t, j.Status.LastRunAt.IsZero())
	assert.Equal(t, []string{"Normal RecurringJobStarted", "Normal RecurringJobCompleted"}, fixture.DrainEvents(rec))
	names := snapshotNames(t, env)
	assert.Equal(t, []string{recurringObjectName("j", "v1", at("12:00:00"))}, names)

	require.Eventually(t, func() bool {
		j, err := env.DS.RecurringJobs.GetRO("j")
		return err == nil && j.Status.LastRunVolumes == 1
	}, 5*time.Second, 10*time.Millisecond)
	env.ClearActions()
	require.NoError(t, c.syncRecurringJob(context.Background(), key))
	assert.Empty(t, fixture.Writes(env.Strata.Actions()), "a quiet job is not written")
}

// markTakenOnCreate plays the snapshot and backup controllers: a Snapshot
// is created taken (ready, at the clock's time), a Backup completed.
func markTakenOnCreate(env *dstest.Env) {
	env.Strata.PrependReactor("create", "snapshots", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*v1beta1.Snapshot)
		s.Status.ReadyToUse, s.Status.UserCreated = true, true
		s.Status.CreationTime = env.Clock.Now().Format(time.RFC3339)
		return false, nil, nil
	})
	env.Strata.PrependReactor("create", "backups", func(a k8stesting.Action) (bool, runtime.Object, error) {
		b := a.(k8stesting.CreateAction).GetObject().(*v1beta1.Backup)
		b.Status.State, b.Status.VolumeName = v1beta1.BackupStateCompleted, b.Labels[types.LabelVolume]
		b.Status.SnapshotName = b.Spec.SnapshotName
		b.Status.BackupCreatedAt = env.Clock.Now().Format(time.RFC3339)
		return false, nil, nil
	})
}

func snapshotNames(t *testing.T, env *dstest.Env) []string {
	t.Helper()
	l, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []string
	for _, s := range l.Items {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}

func backupNames(t *testing.T, env *dstest.Env) []string {
	t.Helper()
	l, err := env.Strata.StrataV1beta1().Backups(fixture.NS).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	var out []string
	for _, b := range l.Items {
		out = append(out, b.Name)
	}
	slices.Sort(out)
	return out
}

func labelledVolume(name string, labels map[string]string, mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
	return fixture.Volume(append([]func(*v1beta1.Volume){func(v *v1beta1.Volume) {
		v.Name, v.UID, v.Labels = name, k8stypes.UID("uid-"+name), labels
	}}, mut...)...)
}

// jobSnapshot is a taken snapshot of volume made by job at hh:mm:ss.
func jobSnapshot(job, volume, hhmmss string, mut ...func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	name := recurringObjectName(job, volume, at(hhmmss))
	return takenSnapshot(name, volume, hhmmss, append([]func(*v1beta1.Snapshot){func(s *v1beta1.Snapshot) {
		s.Labels[types.LabelRecurringJob] = job
	}}, mut...)...)
}

func takenSnapshot(name, volume, hhmmss string, mut ...func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	return fixture.Snapshot(name, true, append([]func(*v1beta1.Snapshot){func(s *v1beta1.Snapshot) {
		s.Spec.Volume, s.Labels[types.LabelVolume] = volume, volume
		s.Status.ReadyToUse, s.Status.UserCreated, s.Status.CreationTime = true, true, at(hhmmss).Format(time.RFC3339)
	}}, mut...)...)
}

func jobBackup(job, volume, hhmmss string, state v1beta1.BackupState) *v1beta1.Backup {
	name := recurringObjectName(job, volume, at(hhmmss))
	return fixture.Backup(name, name, func(b *v1beta1.Backup) {
		b.Labels = map[string]string{types.LabelVolume: volume, types.LabelRecurringJob: job}
		b.Status = v1beta1.BackupStatus{State: state, VolumeName: volume, SnapshotName: name, OwnerID: "node-1",
			BackupCreatedAt: at(hhmmss).Format(time.RFC3339)}
	})
}

func enabled(keys ...string) map[string]string {
	m := map[string]string{}
	for _, k := range keys {
		m[k] = types.RecurringJobLabelEnabled
	}
	return m
}

func jobObjName(job, volume, hhmmss string) string {
	return recurringObjectName(job, volume, at(hhmmss))
}

// One run of a job over the fake API server, the snapshot and backup
// controllers played by markTakenOnCreate: which volumes it picks, what
// it makes and what retention leaves.
func TestRecurringJobRun(t *testing.T) {
	now := "12:00:00"
	deletingVol := func(v *v1beta1.Volume) { ts := metav1.NewTime(dstest.Now); v.DeletionTimestamp = &ts }
	cloning := func(v *v1beta1.Volume) {
		v.Status.CloneStatus = &v1beta1.VolumeCloneStatus{State: v1beta1.VolumeCloneStateCopying}
	}
	restoring := func(v *v1beta1.Volume) {
		v.Status.RestoreStatus = &v1beta1.VolumeRestoreStatus{State: v1beta1.VolumeRestoreStateRestoring}
	}
	systemSnap := func(s *v1beta1.Snapshot) { s.Status.UserCreated = false }
	ownedByBackup := func(s *v1beta1.Snapshot) {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "Backup", Name: "b9"}}
	}
	failedSnap := func(s *v1beta1.Snapshot) { s.Status.ReadyToUse, s.Status.Error = false, "snapshot limit exceeded: x" }
	cases := []struct {
		name          string
		job           *v1beta1.RecurringJob
		objects       []runtime.Object
		wantVolumes   int
		wantErr       string
		wantSnapshots []string
		wantBackups   []string
	}{
		{name: "selection: by the job's label and by its groups; disabled, deleted, cloning and restoring volumes left out",
			job: testJob("daily", v1beta1.RecurringJobTaskSnapshot, "@daily", 3, func(j *v1beta1.RecurringJob) { j.Spec.Groups = []string{"g1"} }),
			objects: []runtime.Object{
				labelledVolume("v1", enabled(types.RecurringJobVolumeLabel("daily"))),
				labelledVolume("v2", enabled(types.RecurringJobGroupLabel("g1"))),
				labelledVolume("v3", nil),
				labelledVolume("v4", enabled(types.RecurringJobVolumeLabel("hourly"))),
				labelledVolume("v5", map[string]string{types.RecurringJobGroupLabel("g1"): "disabled"}),
				labelledVolume("v6", enabled(types.RecurringJobVolumeLabel("daily")), deletingVol),
				labelledVolume("v7", enabled(types.RecurringJobGroupLabel("g1")), cloning),
				labelledVolume("v8", enabled(types.RecurringJobGroupLabel("g1")), restoring),
			},
			wantVolumes:   2,
			wantSnapshots: []string{jobObjName("daily", "v1", now), jobObjName("daily", "v2", now)},
		},
		{name: "selection: group default is every volume without recurring-job labels",
			job: testJob("daily", v1beta1.RecurringJobTaskSnapshot, "@daily", 3, func(j *v1beta1.RecurringJob) {
				j.Spec.Groups = []string{types.RecurringJobDefaultGroup}
			}),
			objects: []runtime.Object{
				labelledVolume("v1", enabled(types.RecurringJobVolumeLabel("hourly"))),
				labelledVolume("v2", map[string]string{"app": "db"}),
				labelledVolume("v3", map[string]string{types.RecurringJobGroupLabel("default"): "disabled"}),
				labelledVolume("v4", enabled(types.RecurringJobGroupLabel("default"))),
			},
			wantVolumes:   2,
			wantSnapshots: []string{jobObjName("daily", "v2", now), jobObjName("daily", "v4", now)},
		},
		{name: "snapshot retain 3: the oldest two of the job's go, a failure older than a good one goes, others' stay",
			job: testJob("j", v1beta1.RecurringJobTaskSnapshot, "* * * * *", 3),
			objects: []runtime.Object{
				labelledVolume("v1", enabled(types.RecurringJobVolumeLabel("j"))),
				jobSnapshot("j", "v1", "11:56:00"), jobSnapshot("j", "v1", "11:57:00"),
				jobSnapshot("j", "v1", "11:58:00", failedSnap),
				jobSnapshot("j", "v1", "11:58:30"), jobSnapshot("j", "v1", "11:59:00"),
				jobSnapshot("old-j", "v1", "11:00:00"),
				takenSnapshot("mine", "v1", "10:00:00"),
			},
			wantVolumes: 1,
			wantSnapshots: []string{jobObjName("j", "v1", "11:58:30"), jobObjName("j", "v1", "11:59:00"), jobObjName("j", "v1", now),
				"mine", jobObjName("old-j", "v1", "11:00:00")},
		},
		{name: "a retried run finds its snapshot and makes no second one",
			job: testJob("j", v1beta1.RecurringJobTaskSnapshot, "* * * * *", 3),
			objects: []runtime.Object{
				labelledVolume("v1", enabled(types.RecurringJobVolumeLabel("j"))),
				jobSnapshot("j", "v1", now),
			},
			wantVolumes:   1,
			wantSnapshots: []string{jobObjName("j", "v1", now)},
		},
		{name: "the name taken by another's snapshot fails the volume",
			job: testJob("j", v1beta1.RecurringJobTaskSnapshot, "* * * * *", 3),
			objects: []runtime.Object{
				labelledVolume("v1", enabled(types.RecurringJobVolumeLabel("j"))),
				takenSnapshot(jobObjName("j", "v1", now), "v1", "11:00:00"),
			},
			wantVolumes: 1, wantErr: "volume v1: creating snapshot " + jobObjName("j", "v1", now) + ": the name is taken",
			wantSnapshots: []string{jobObjName("j", "v1", now)},
		},
		{name: "backup retain 2: the job's Completed backups beyond 2 go; a running one is kept and so is its snapshot",
			job: testJob("b", v1beta1.RecurringJobTaskBackup, "* * * * *", 2),
			objects: []runtime.Object{
				labelledVolume("v1", enabled(types.RecurringJobVolumeLabel("b"))),
				jobSnapshot("b", "v1", "11:57:00"), jobSnapshot("b", "v1", "11:58:00"), jobSnapshot("b", "v1", "11:59:00"),
				jobBackup("b", "v1", "11:57:00", v1beta1.BackupStateInProgress),
				jobBackup("b", "v1", "11:58:00", v1beta1.BackupStateCompleted),
				jobBackup("b", "v1", "11:59:00", v1beta1.BackupStateCompleted),
			},
			wantVolumes:   1,
			wantSnapshots: []string{jobObjName("b", "v1", "11:57:00"), jobObjName("b", "v1", "11:59:00"), jobObjName("b", "v1", now)},
			wantBackups:   []string{jobObjName("b", "v1", "11:57:00"), jobObjName("b", "v1", "11:59:00"), jobObjName("b", "v1", now)},
		},
		{name: "snapshot-delete retain 1: the newest user snapshot stays; system, backup-owned and in-use ones are never touched",
			job: testJob("d", v1beta1.RecurringJobTaskSnapshotDelete, "@hourly", 1, inDefaultGroup),
			objects: []runtime.Object{
				labelledVolume("v1", nil),
				takenSnapshot("u1", "v1", "09:00:00"), takenSnapshot("u2", "v1", "10:00:00"), takenSnapshot("u3", "v1", "11:00:00"),
				jobSnapshot("j", "v1", "11:30:00"),
				takenSnapshot("sys", "v1", "08:00:00", systemSnap),
				takenSnapshot("for-backup", "v1", "08:00:00", ownedByBackup, systemSnap),
				takenSnapshot("being-backed-up", "v1", "08:30:00"),
				fixture.Backup("running", "being-backed-up", fixture.BackupState(v1beta1.BackupStateInProgress, 10)),
			},
			wantVolumes:   1,
			wantSnapshots: []string{"being-backed-up", "for-backup", jobObjName("j", "v1", "11:30:00"), "sys"},
			wantBackups:   []string{"running"},
		},
		{name: "snapshot-cleanup: system snapshots and removed ones go; user ones and those taken for a backup stay",
			job: testJob("c", v1beta1.RecurringJobTaskSnapshotCleanup, "@hourly", 0, inDefaultGroup),
			objects: []runtime.Object{
				labelledVolume("v1", nil),
				takenSnapshot("u1", "v1", "09:00:00"),
				takenSnapshot("sys", "v1", "08:00:00", systemSnap),
				takenSnapshot("removed", "v1", "08:00:00", func(s *v1beta1.Snapshot) { s.Status.MarkRemoved, s.Status.ReadyToUse = true, false }),
				takenSnapshot("for-backup", "v1", "08:00:00", ownedByBackup, systemSnap),
				fixture.Snapshot("being-taken", true),
			},
			wantVolumes:   1,
			wantSnapshots: []string{"being-taken", "for-backup", "u1"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, append(tc.objects, tc.job), []runtime.Object{fixture.Lease("node-1", 0)})
			markTakenOnCreate(env)
			c := newRecurringJobController(t, env, record.NewFakeRecorder(50), "node-1", fixture.NewFakeConnector(nil))
			out := c.runJob(context.Background(), c.Logger, tc.job, at(now))
			if tc.wantErr != "" {
				require.Error(t, out.err)
				assert.Contains(t, out.err.Error(), tc.wantErr)
			} else {
				require.NoError(t, out.err)
			}
			assert.Equal(t, tc.wantVolumes, out.volumes, "volumes")
			assert.Equal(t, tc.wantSnapshots, snapshotNames(t, env), "snapshots left")
			assert.Equal(t, tc.wantBackups, backupNames(t, env), "backups left")
		})
	}
}

// A run works on at most spec.concurrency volumes at once.
func TestRecurringJobConcurrency(t *testing.T) {
	var objs []runtime.Object
	for _, v := range []string{"v1", "v2", "v3", "v4", "v5"} {
		objs = append(objs, labelledVolume(v, nil))
	}
	job := testJob("j", v1beta1.RecurringJobTaskSnapshot, "@hourly", 3, func(j *v1beta1.RecurringJob) {
		j.Spec.Groups, j.Spec.Concurrency = []string{"default"}, 2
	})
	env := dstest.New(t, append(objs, job), []runtime.Object{fixture.Lease("node-1", 0)})
	c := newRecurringJobController(t, env, record.NewFakeRecorder(50), "node-1", fixture.NewFakeConnector(nil))
	done := make(chan runOutcome)
	go func() { done <- c.runJob(context.Background(), c.Logger, job, at("12:00:00")) }()
	// Play the snapshot controller slowly: every 30 ms, note how many
	// snapshots wait to be taken, then take them.
	most := 0
	snaps := env.Strata.StrataV1beta1().Snapshots(fixture.NS)
	for {
		select {
		case out := <-done:
			require.NoError(t, out.err)
			assert.Equal(t, 5, out.volumes)
			assert.Equal(t, 2, most, "volumes worked on at once")
			assert.Len(t, snapshotNames(t, env), 5)
			return
		case <-time.After(30 * time.Millisecond):
		}
		l, err := snaps.List(context.Background(), metav1.ListOptions{})
		require.NoError(t, err)
		waiting := 0
		for i := range l.Items {
			if s := &l.Items[i]; !s.Status.ReadyToUse {
				waiting++
				s.Status.ReadyToUse = true
				_, err := snaps.UpdateStatus(context.Background(), s, metav1.UpdateOptions{})
				require.NoError(t, err)
			}
		}
		most = max(most, waiting)
	}
}

func TestDueTick(t *testing.T) {
	cases := []struct {
		cron, base, now string
		wantDue         bool
		want            string
	}{
		{"*/5 * * * *", "11:55:00", "11:59:59", false, "12:00:00"},
		{"*/5 * * * *", "11:55:00", "12:00:00", true, "12:00:00"},
		{"*/5 * * * *", "11:55:00", "12:07:00", true, "12:05:00"},
		{"7 * * * *", "01:07:00", "12:00:00", true, "11:07:00"},
		{"* * * * *", "00:00:30", "12:00:10", true, "12:00:00"},
		{"@hourly", "11:00:00", "11:30:00", false, "12:00:00"},
		{"@every 90s", "11:00:00", "11:01:30", true, "11:01:30"},
	}
	for _, tc := range cases {
		s, err := cron.ParseStandard(tc.cron)
		require.NoError(t, err)
		got, due := dueTick(s, at(tc.base), at(tc.now))
		assert.Equal(t, tc.wantDue, due, "%s from %s at %s", tc.cron, tc.base, tc.now)
		assert.Equal(t, at(tc.want), got.UTC(), "%s from %s at %s", tc.cron, tc.base, tc.now)
	}
	// A month of minutely ticks missed: still one run, for the latest.
	s, _ := cron.ParseStandard("* * * * *")
	got, due := dueTick(s, dstest.Now.Add(-30*24*time.Hour), dstest.Now.Add(30*time.Second))
	assert.True(t, due)
	assert.Equal(t, dstest.Now, got.UTC())
}

func TestRecurringObjectName(t *testing.T) {
	tick := at("12:00:00")
	n := recurringObjectName("daily", "v1", tick)
	assert.Regexp(t, `^daily-v1-`+tick.Format("20060102")+`-120000-[0-9a-f]{6}$`, n)
	assert.Equal(t, n, recurringObjectName("daily", "v1", tick), "deterministic")
	assert.NotEqual(t, recurringObjectName("a-b", "c", tick), recurringObjectName("a", "b-c", tick))
	assert.NotEqual(t, n, recurringObjectName("daily", "v1", tick.Add(time.Minute)))
	long := recurringObjectName("a-very-long-recurring-job-name-for-backups", "pvc-0123456789abcdef-0123456789abcdef", tick)
	assert.LessOrEqual(t, len(long), 63)
	require.NoError(t, types.ValidateSnapshotName(long))
	assert.NotEqual(t, long, recurringObjectName("a-very-long-recurring-job-name-for-backups", "pvc-0123456789abcdef-0123456789abcdee", tick))
	dotted := recurringObjectName("job.with.dots.and.more.dots.to.fill.forty.ch", "v", tick)
	assert.NotContains(t, dotted, ".-")
}

func TestRetentionVictims(t *testing.T) {
	good := func(n string, min int) retainItem {
		return retainItem{name: n, at: dstest.Now.Add(time.Duration(min) * time.Minute), state: retainGood}
	}
	failed := func(n string, min int) retainItem {
		return retainItem{name: n, at: dstest.Now.Add(time.Duration(min) * time.Minute), state: retainFailed}
	}
	pending := func(n string, min int) retainItem {
		return retainItem{name: n, at: dstest.Now.Add(time.Duration(min) * time.Minute), state: retainPending}
	}
	cases := []struct {
		name   string
		items  []retainItem
		retain int
		want   []string
	}{
		{"fewer than retain", []retainItem{good("a", 1), good("b", 2)}, 3, nil},
		{"the oldest beyond retain", []retainItem{good("a", 1), good("b", 2), good("c", 3), good("d", 4)}, 3, []string{"a"}},
		{"retain 0 drops every good one", []retainItem{good("a", 1), good("b", 2)}, 0, []string{"b", "a"}},
		{"pending never counted nor dropped", []retainItem{pending("p", 9), good("a", 1), good("b", 2)}, 1, []string{"a"}},
		{"the newest failure stays while nothing replaced it", []retainItem{failed("f", 3), good("a", 1)}, 3, nil},
		{"a failure older than a good one goes", []retainItem{failed("f", 1), good("a", 2)}, 3, []string{"f"}},
		{"same time: by name", []retainItem{good("a", 1), good("b", 1)}, 1, []string{"a"}},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, retentionVictims(tc.items, tc.retain), tc.name)
	}
}

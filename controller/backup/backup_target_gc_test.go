package backup

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// gcTarget is a file:// target holding backup b1 of volume v1 and b2 of
// v2 (distinct random data, so distinct packs), with the given backups'
// manifests then deleted, as a Backup deletion leaves them.
type gcTarget struct {
	dir   string
	store *backupstore.FileStore
	packs map[string][]backupstore.PackID // by backup
}

func newGCTarget(t *testing.T, deleted ...string) *gcTarget {
	t.Helper()
	ctx := context.Background()
	g := &gcTarget{dir: t.TempDir(), packs: map[string][]backupstore.PackID{}}
	var err error
	g.store, err = backupstore.NewFileStore(g.dir)
	require.NoError(t, err)
	tgt, err := backupstore.Open(ctx, g.store, backupstore.Options{ChunkSize: 64 << 10, PackSize: 128 << 10})
	require.NoError(t, err)
	for i, b := range []struct{ volume, name string }{{"v1", "b1"}, {"v2", "b2"}} {
		data := randomData(uint64(i), 4*64<<10)
		m, err := tgt.Backup(ctx, backupstore.BackupInput{Volume: b.volume, Backup: b.name, Snapshot: "s-" + b.name,
			Size: int64(len(data)), Source: bytes.NewReader(data)})
		require.NoError(t, err)
		g.packs[b.name] = m.Packs
	}
	for _, name := range deleted {
		require.NoError(t, tgt.DeleteBackup(ctx, map[string]string{"b1": "v1", "b2": "v2"}[name], name))
	}
	return g
}

func randomData(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// packsLeft says, per backup, how many of its packs are still stored.
func (g *gcTarget) packsLeft(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for b, ids := range g.packs {
		for _, id := range ids {
			h := id.String()
			if _, err := g.store.Stat(context.Background(), "packs/"+h[:2]+"/"+h); err == nil {
				out[b]++
			}
		}
	}
	return out
}

func gcBackupTarget(g *gcTarget, mut ...func(*v1beta1.BackupTarget)) *v1beta1.BackupTarget {
	bt := availableTarget(g.dir)
	bt.Status.OwnerID, bt.Status.LastSyncedAt = "node-1", metav1.NewTime(dstest.Now)
	bt.Annotations = map[string]string{AnnotationBackupGCRequestedAt: "request-0"}
	for _, m := range mut {
		m(bt)
	}
	return bt
}

func gcSetting(name types.SettingName, value string) *v1beta1.Setting {
	return &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(name), Namespace: fixture.NS}, Value: value}
}

func gcSyncFunc(env *dstest.Env, rec record.EventRecorder, me string, _ engineapi.Connector) (func(context.Context, string) error, error) {
	c, err := NewBackupTargetController(logrus.New(), env.DS, rec, me)
	if err != nil {
		return nil, err
	}
	return c.syncBackupTargetGC, nil
}

func wantGC(reason, msg string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		bt, err := env.Strata.StrataV1beta1().BackupTargets(fixture.NS).Get(context.Background(), "default", metav1.GetOptions{})
		require.NoError(t, err)
		cond := meta.FindStatusCondition(bt.Status.Conditions, ConditionTypeGarbageCollected)
		require.NotNil(t, cond)
		assert.Equal(t, reason, cond.Reason)
		assert.Contains(t, cond.Message, msg)
	}
}

func wantPacksLeft(g *gcTarget, want map[string]int) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, _ *dstest.Env) {
		assert.Equal(t, want, g.packsLeft(t), "packs left per backup")
	}
}

func TestSyncBackupTargetGC(t *testing.T) {
	noGrace := gcSetting(types.SettingBackupGCGrace, "0")
	completed := func(name, url string, mut ...func(*v1beta1.Backup)) *v1beta1.Backup {
		b := completedBackup(name, "s-"+name, url, "2026-11-21T10:00:00Z")
		for _, m := range mut {
			m(b)
		}
		return b
	}
	now := metav1.NewTime(dstest.Now)
	deleting := func(b *v1beta1.Backup) { b.DeletionTimestamp = &now }

	afterDelete := newGCTarget(t, "b1")
	allDeleted := newGCTarget(t, "b1", "b2")
	recorded := newGCTarget(t, "b1", "b2")
	taking := newGCTarget(t, "b1", "b2")
	inFlight := newGCTarget(t, "b1")
	require.NoError(t, inFlight.store.Put(context.Background(), "inflight/v3/b3-0011", bytes.NewReader(nil), 0))
	withGrace := newGCTarget(t, "b1")
	other := newGCTarget(t, "b1")
	url := func(g *gcTarget) string { return "file://" + g.dir }

	fixture.RunSyncCases(t, []fixture.SyncCase{
		{Name: "after a delete: the packs only the deleted backup used go, the others stay", Key: fixture.NS + "/default",
			Objects:    fixture.WithNodes(gcBackupTarget(afterDelete), noGrace, completed("b2", url(afterDelete))),
			WantWrites: []string{"update backuptargets/status default"}, WantEvents: []string{"Normal GarbageCollected"},
			Check: fixture.AllChecks(wantPacksLeft(afterDelete, map[string]int{"b2": len(afterDelete.packs["b2"])}),
				wantGC(BackupTargetReasonGCCollected, "packs referenced by 1 backups"))},
		{Name: "an empty listing the cluster agrees with (no Backup CRs): ConfirmEmpty, everything goes", Key: fixture.NS + "/default",
			Objects: fixture.WithNodes(gcBackupTarget(allDeleted), noGrace,
				completed("b1", url(allDeleted), deleting), completed("b-elsewhere", "file:///elsewhere")),
			WantWrites: []string{"update backuptargets/status default"}, WantEvents: []string{"Normal GarbageCollected"},
			Check: fixture.AllChecks(wantPacksLeft(allDeleted, map[string]int{}), wantGC(BackupTargetReasonGCCollected, "0 backups"))},
		{Name: "an empty listing while the cluster records a completed backup: nothing deleted", Key: fixture.NS + "/default",
			Objects:    fixture.WithNodes(gcBackupTarget(recorded), noGrace, completed("b2", url(recorded))),
			WantWrites: []string{"update backuptargets/status default"}, WantEvents: []string{"Warning GarbageCollectionDeferred"},
			Check: fixture.AllChecks(wantPacksLeft(recorded, map[string]int{"b1": len(recorded.packs["b1"]), "b2": len(recorded.packs["b2"])}),
				wantGC(BackupTargetReasonGCDeferred, "the cluster records 1 completed backups of the target (b2)"))},
		{Name: "an empty listing while a backup is being taken: deferred", Key: fixture.NS + "/default",
			Objects: fixture.WithNodes(gcBackupTarget(taking), noGrace, fixture.Backup("b3", "s3", func(b *v1beta1.Backup) {
				b.Status.State = v1beta1.BackupStatePending
			})),
			WantWrites: []string{"update backuptargets/status default"}, WantEvents: []string{"Warning GarbageCollectionDeferred"},
			Check: fixture.AllChecks(wantPacksLeft(taking, map[string]int{"b1": len(taking.packs["b1"]), "b2": len(taking.packs["b2"])}),
				wantGC(BackupTargetReasonGCDeferred, "backup b3 is in progress"))},
		{Name: "a backup's fresh inflight marker on the target: deferred", Key: fixture.NS + "/default",
			Objects:    fixture.WithNodes(gcBackupTarget(inFlight), noGrace, completed("b2", url(inFlight))),
			WantWrites: []string{"update backuptargets/status default"}, WantEvents: []string{"Warning GarbageCollectionDeferred"},
			Check: fixture.AllChecks(wantPacksLeft(inFlight, map[string]int{"b1": len(inFlight.packs["b1"]), "b2": len(inFlight.packs["b2"])}),
				wantGC(BackupTargetReasonGCDeferred, "backup in flight (v3/b3-0011"))},
		{Name: "within the default grace (60 min) fresh packs stay: no event, the condition says so", Key: fixture.NS + "/default",
			Objects:    fixture.WithNodes(gcBackupTarget(withGrace), completed("b2", url(withGrace))),
			WantWrites: []string{"update backuptargets/status default"},
			Check: fixture.AllChecks(wantPacksLeft(withGrace, map[string]int{"b1": len(withGrace.packs["b1"]), "b2": len(withGrace.packs["b2"])}),
				wantGC(BackupTargetReasonGCCollected, "0 packs (0 bytes) deleted"))},
		{Name: "another manager owns the target: it collects it, this one does nothing", Key: fixture.NS + "/default", Me: "node-2",
			Objects: fixture.WithNodes(gcBackupTarget(other), noGrace, completed("b2", url(other))),
			Check:   wantPacksLeft(other, map[string]int{"b1": len(other.packs["b1"]), "b2": len(other.packs["b2"])})},
		{Name: "an unavailable target: no GC", Key: fixture.NS + "/default",
			Objects: fixture.WithNodes(gcBackupTarget(other, func(bt *v1beta1.BackupTarget) { bt.Status.Available = false }), noGrace),
			Check:   wantPacksLeft(other, map[string]int{"b1": len(other.packs["b1"]), "b2": len(other.packs["b2"])})},
	}, gcSyncFunc)
}

// A GC ran: the next sync with the same request and within the interval
// touches neither the API nor the store, and only sets the timer; a new
// request (a later delete) runs one again.
func TestBackupTargetGCIsQuietUntilDue(t *testing.T) {
	g := newGCTarget(t, "b1")
	env := dstest.New(t, fixture.WithNodes(gcBackupTarget(g), gcSetting(types.SettingBackupGCGrace, "0"),
		completedBackup("b2", "s-b2", "file://"+g.dir, "x")), []runtime.Object{fixture.Lease("node-1", 0)})
	rec := record.NewFakeRecorder(10)
	c, err := NewBackupTargetController(logrus.New(), env.DS, rec, "node-1")
	require.NoError(t, err)
	opened := 0
	c.storeFor = func(url string, secret map[string][]byte) (backupstore.ObjectStore, error) {
		opened++
		return backupstore.StoreFor(url, secret)
	}
	key := fixture.NS + "/default"
	require.NoError(t, c.syncBackupTargetGC(context.Background(), key))
	assert.Equal(t, 1, opened)
	assert.Equal(t, []string{"Normal GarbageCollected"}, fixture.DrainEvents(rec))

	env.ClearActions()
	waitCacheHas(t, env)
	// The informer's adds of the target are in the queues; take them out.
	for _, q := range []interface {
		Len() int
		Get() (string, bool)
		Done(string)
	}{c.Queue, c.gcQueue} {
		for q.Len() > 0 {
			k, _ := q.Get()
			q.Done(k)
		}
	}
	require.NoError(t, c.syncBackupTargetGC(context.Background(), key))
	assert.Equal(t, 1, opened, "not due: the store is not opened")
	assert.Empty(t, fixture.Writes(env.Strata.Actions()))
	assert.Empty(t, fixture.DrainEvents(rec))
	assert.Zero(t, c.gcQueue.Len(), "only the timer (AddAfter) is pending")
	assert.Zero(t, c.Queue.Len(), "the GC's condition write did not enqueue a poll")

	bt, err := env.DS.BackupTargets.GetRO("default")
	require.NoError(t, err)
	require.NoError(t, requestBackupTargetGC(context.Background(), env.DS, bt))
	require.Eventually(t, func() bool {
		got, err := env.DS.BackupTargets.GetRO("default")
		return err == nil && got.Annotations[AnnotationBackupGCRequestedAt] != bt.Annotations[AnnotationBackupGCRequestedAt]
	}, 5*time.Second, 10*time.Millisecond)
	env.ClearActions()
	require.NoError(t, c.syncBackupTargetGC(context.Background(), key))
	assert.Equal(t, 2, opened, "a new request runs a GC")
	assert.Equal(t, []string{"update backuptargets/status default"}, fixture.Writes(env.Strata.Actions()),
		"the condition now says nothing was deleted")
	assert.Empty(t, fixture.DrainEvents(rec), "nothing deleted: no event")
}

func TestPlanBackupGC(t *testing.T) {
	const url = "s3://b@r/p"
	listed := testBackupTarget(url, "")
	listed.Status.LastSyncedAt = metav1.NewTime(dstest.Now)
	now := metav1.NewTime(dstest.Now)
	bk := func(name string, state v1beta1.BackupState, bURL string, mut ...func(*v1beta1.Backup)) *v1beta1.Backup {
		b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1beta1.BackupStatus{State: state, URL: bURL}}
		for _, m := range mut {
			m(b)
		}
		return b
	}
	deleting := func(b *v1beta1.Backup) { b.DeletionTimestamp = &now }
	cases := []struct {
		name    string
		target  *v1beta1.BackupTarget
		backups []*v1beta1.Backup
		confirm bool
		blocker string
	}{
		{name: "never listed: the cluster's records say nothing yet", target: testBackupTarget(url, ""),
			blocker: "has not been listed yet"},
		{name: "no Backup at all", target: listed, confirm: true},
		{name: "a completed backup of the target", target: listed,
			backups: []*v1beta1.Backup{bk("a", v1beta1.BackupStateCompleted, url)}, blocker: "records 1 completed backups of the target (a)"},
		{name: "a completed backup being deleted (its manifest is going)", target: listed,
			backups: []*v1beta1.Backup{bk("a", v1beta1.BackupStateCompleted, url, deleting)}, confirm: true},
		{name: "backups of another target and failed ones", target: listed,
			backups: []*v1beta1.Backup{bk("a", v1beta1.BackupStateCompleted, "file:///x"), bk("b", v1beta1.BackupStateError, url),
				bk("c", v1beta1.BackupStateInProgress, "file:///x")}, confirm: true},
		{name: "a backup in progress to the target", target: listed,
			backups: []*v1beta1.Backup{bk("a", v1beta1.BackupStateInProgress, url)}, blocker: "backup a is in progress"},
		{name: "a new backup with no URL yet (it will go to the default target)", target: listed,
			backups: []*v1beta1.Backup{bk("a", "", "")}, blocker: "backup a is in progress"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := planBackupGC(tc.target, tc.backups)
			assert.Equal(t, tc.confirm, p.confirmEmpty)
			if tc.blocker == "" {
				assert.Empty(t, p.blocker)
			} else {
				assert.Contains(t, p.blocker, tc.blocker)
			}
		})
	}
}

func TestGCDue(t *testing.T) {
	now := dstest.Now
	cases := []struct {
		name      string
		mem       gcMemory
		requested string
		interval  time.Duration
		due       bool
		wait      time.Duration
	}{
		{name: "first sight", interval: time.Hour, due: true},
		{name: "first sight, periodic GC off", interval: 0},
		{name: "a new request", mem: gcMemory{lastRun: now, handled: "r1"}, requested: "r2", interval: time.Hour, due: true},
		{name: "a new request, periodic GC off", mem: gcMemory{lastRun: now}, requested: "r1", due: true},
		{name: "the request handled, within the interval", mem: gcMemory{lastRun: now.Add(-20 * time.Minute), handled: "r1"},
			requested: "r1", interval: time.Hour, wait: 40 * time.Minute},
		{name: "the interval passed", mem: gcMemory{lastRun: now.Add(-time.Hour), handled: "r1"}, requested: "r1",
			interval: time.Hour, due: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			due, wait := gcDue(tc.mem, tc.requested, tc.interval, now)
			assert.Equal(t, tc.due, due)
			assert.Equal(t, tc.wait, wait)
		})
	}
}

package volume

import (
	"context"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// cloneTarget is volume v2, filled from source (v1 or one of its snapshots).
func cloneTarget(source string, mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
	v := fixture.Volume(func(v *v1beta1.Volume) {
		v.Name, v.UID, v.Spec.DataSource = "v2", "uid-v2", source
	})
	for _, m := range mut {
		m(v)
	}
	return v
}

func cloneState(state v1beta1.VolumeCloneState) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Status.CloneStatus = &v1beta1.VolumeCloneStatus{SourceVolume: "v1", Snapshot: "s1", State: state}
	}
}

func vaFor(volume string, tickets ...*v1beta1.AttachmentTicket) *v1beta1.VolumeAttachment {
	va := fixture.VA(tickets...)
	va.Name, va.Spec.Volume = volume, volume
	return va
}

func cloneStatusOf(t *testing.T, env *dstest.Env) *v1beta1.VolumeCloneStatus {
	t.Helper()
	v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v2", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, v.Status.CloneStatus)
	return v.Status.CloneStatus
}

func wantCloneStatus(state v1beta1.VolumeCloneState, message string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		cs := cloneStatusOf(t, env)
		assert.Equal(t, state, cs.State)
		assert.Contains(t, cs.Message, message)
	}
}

func wantTickets(volume string, ids ...string) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), volume, metav1.GetOptions{})
		require.NoError(t, err)
		var got []string
		for id := range va.Spec.AttachmentTickets {
			got = append(got, id)
		}
		assert.ElementsMatch(t, ids, got, "tickets of %s", volume)
	}
}

func cloneSyncFunc(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
	c, err := NewVolumeCloneController(logrus.New(), env.DS, rec, me, dp)
	if err != nil {
		return nil, err
	}
	return c.syncClone, nil
}

// TestVolumeCloneControllerSync covers every step short of the copy, which
// TestVolumeCloneControllerCopies runs.
func TestVolumeCloneControllerSync(t *testing.T) {
	cloneTicket := fixture.Ticket("clone-v2", v1beta1.AttacherTypeVolumeCloneController, "node-1")
	key := fixture.NS + "/v2"
	cases := []fixture.SyncCase{
		{Name: "a ready snapshot, both detached: tickets on both volumes, pending",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("snap://v1/s1"), fixture.ReadySnap("s1"), fixture.VA(), vaFor("v2")), Key: key,
			WantWrites: []string{"update volumeattachments v2", "update volumeattachments v1", "update volumes/status v2"},
			Check: fixture.AllChecks(wantCloneStatus(v1beta1.VolumeCloneStatePending, "waiting for volume v2 to attach"),
				wantTickets("v1", "clone-v2"), wantTickets("v2", "clone-v2"),
				func(t *testing.T, env *dstest.Env) {
					va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), "v2", metav1.GetOptions{})
					require.NoError(t, err)
					assert.Equal(t, v1beta1.TrueValue, va.Spec.AttachmentTickets["clone-v2"].Parameters[v1beta1.AttachmentParameterDisableFrontend],
						"nothing reads the target before the copy is done")
					assert.Equal(t, "Volume", va.Spec.AttachmentTickets["clone-v2"].OwnerRef.Kind)
				})},
		{Name: "a snapshot not ready yet: waits, no ticket",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("snap://v1/s1"), fixture.Snapshot("s1", true), fixture.VA(), vaFor("v2")), Key: key,
			WantWrites: []string{"update volumes/status v2"},
			Check:      wantCloneStatus(v1beta1.VolumeCloneStatePending, "waiting for snapshot s1 of volume v1 to be ready")},
		{Name: "a whole volume: a snapshot is taken for the clone",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("vol://v1"), fixture.VA(), vaFor("v2")), Key: key,
			WantWrites: []string{"create snapshots clone-v2", "update volumes/status v2"},
			Check: func(t *testing.T, env *dstest.Env) {
				s, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(context.Background(), "clone-v2", metav1.GetOptions{})
				require.NoError(t, err)
				assert.Equal(t, "v1", s.Spec.Volume)
				assert.True(t, s.Spec.CreateSnapshot)
				require.Len(t, s.OwnerReferences, 1, "the snapshot goes with the clone")
				assert.Equal(t, "v2", s.OwnerReferences[0].Name)
			}},
		{Name: "the source snapshot is gone: failed for good",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("snap://v1/s1"), fixture.VA(), vaFor("v2")), Key: key,
			WantWrites: []string{"update volumes/status v2"}, WantEvents: []string{"Warning CloneFailed"},
			Check: fixture.AllChecks(wantCloneStatus(v1beta1.VolumeCloneStateFailed, "source snapshot s1 of volume v1 went away"),
				func(t *testing.T, env *dstest.Env) {
					v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v2", metav1.GetOptions{})
					require.NoError(t, err)
					c := meta.FindStatusCondition(v.Status.Conditions, VolumeConditionCloned)
					require.NotNil(t, c)
					assert.Equal(t, metav1.ConditionFalse, c.Status)
					assert.Equal(t, "CloneFailed", c.Reason)
				})},
		{Name: "the source volume is gone mid-way: failed; the ticket stays until that is stored",
			Objects: fixture.WithNodes(cloneTarget("vol://v1", cloneState(v1beta1.VolumeCloneStatePending)), vaFor("v2", cloneTicket)), Key: key,
			WantWrites: []string{"update volumes/status v2"}, WantEvents: []string{"Warning CloneFailed"},
			Check: fixture.AllChecks(wantCloneStatus(v1beta1.VolumeCloneStateFailed, "source volume v1 went away"), wantTickets("v2", "clone-v2"))},
		{Name: "failed: the tickets are released",
			Objects: fixture.WithNodes(cloneTarget("vol://v1", cloneState(v1beta1.VolumeCloneStateFailed)), vaFor("v2", cloneTicket)), Key: key,
			WantWrites: []string{"update volumeattachments v2", "update volumes/status v2"}, Check: wantTickets("v2")},
		{Name: "completed: the tickets are released, nothing else",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("snap://v1/s1", cloneState(v1beta1.VolumeCloneStateCompleted)),
				fixture.ReadySnap("s1"), fixture.VA(cloneTicket), vaFor("v2", cloneTicket)), Key: key,
			WantWrites: []string{"update volumeattachments v2", "update volumeattachments v1", "update volumes/status v2"},
			Check:      fixture.AllChecks(wantTickets("v1"), wantTickets("v2"))},
		{Name: "another node's clone is left alone", Me: "node-2",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("snap://v1/s1"), fixture.ReadySnap("s1"), fixture.VA(), vaFor("v2")), Key: key},
		{Name: "a volume without a data source: nothing", Objects: fixture.WithNodes(fixture.Volume(), fixture.VA())},
		{Name: "API error writing a ticket: retried",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("snap://v1/s1"), fixture.ReadySnap("s1"), fixture.VA(), vaFor("v2")), Key: key,
			APIErr: &fixture.ReactorError{Verb: "update", Resource: "volumeattachments", Err: assert.AnError}, WantErr: assert.AnError.Error(),
			WantWrites: []string{"update volumeattachments v2", "update volumeattachments v1", "update volumes/status v2"}},
	}
	fixture.RunSyncCases(t, cases, cloneSyncFunc)
}

// TestVolumeCloneControllerCopies starts the copy once both volumes run,
// then takes its outcome: completed, or failed for good on a refusal; the
// tickets go on the sync after that state is stored.
func TestVolumeCloneControllerCopies(t *testing.T) {
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-1:8500"}}
	tests := []struct {
		name       string
		cloneErr   error
		failWrite  bool // the first status write after the copy conflicts
		wantState  v1beta1.VolumeCloneState
		wantEvents []string
	}{
		{name: "the copy succeeds", wantState: v1beta1.VolumeCloneStateCompleted,
			wantEvents: []string{"Normal CloneStarted", "Normal CloneCompleted"}},
		{name: "the copy succeeds, the status write conflicts: the outcome is kept for the retry", failWrite: true,
			wantState:  v1beta1.VolumeCloneStateCompleted,
			wantEvents: []string{"Normal CloneStarted", "Normal CloneCompleted"}},
		{name: "the data plane refuses: failed", cloneErr: engineapi.ErrInvalid, wantState: v1beta1.VolumeCloneStateFailed,
			wantEvents: []string{"Normal CloneStarted", "Warning CloneFailed"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cloneTicket := fixture.Ticket("clone-v2", v1beta1.AttacherTypeVolumeCloneController, "node-1")
			env := dstest.New(t, fixture.WithNodes(fixture.Volume(fixture.AttachedOn("node-1")), fixture.RunningEngine("v1"),
				cloneTarget("snap://v1/s1", fixture.AttachedOn("node-1")), fixture.RunningEngine("v2"), fixture.ReadySnap("s1"), im,
				fixture.VA(cloneTicket), vaFor("v2", cloneTicket)), []runtime.Object{fixture.Lease("node-1", 0)})
			dp := fixture.NewFakeConnector(map[string]error{"SnapshotClone": tc.cloneErr})
			rec := record.NewFakeRecorder(20)
			c, err := NewVolumeCloneController(logrus.New(), env.DS, rec, "node-1", dp)
			require.NoError(t, err)

			require.NoError(t, c.syncClone(context.Background(), fixture.NS+"/v2"))
			cs := cloneStatusOf(t, env)
			assert.Equal(t, v1beta1.VolumeCloneStateCopying, cs.State)
			assert.Equal(t, int32(1), cs.Attempts)
			require.Eventually(t, func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				_, done := c.results["uid-v2"]
				return done
			}, 5*time.Second, 10*time.Millisecond, "the copy ends")
			assert.Equal(t, []string{"SnapshotClone v2-e-0 10.0.0.1:v1 s1"}, dp.Calls())

			require.Eventually(t, func() bool { // the next sync reads the copying state from the cache
				v, err := env.DS.Volumes.GetRO("v2")
				return err == nil && v.Status.CloneStatus != nil
			}, 5*time.Second, 10*time.Millisecond)
			if tc.failWrite {
				failed := false
				env.Strata.PrependReactor("update", "volumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() != "status" || failed {
						return false, nil, nil
					}
					failed = true
					return true, nil, apierrors.NewConflict(v1beta1.Resource("volumes"), "v2", assert.AnError)
				})
				require.Error(t, c.syncClone(context.Background(), fixture.NS+"/v2"))
				assert.Equal(t, v1beta1.VolumeCloneStateCopying, cloneStatusOf(t, env).State)
			}
			require.NoError(t, c.syncClone(context.Background(), fixture.NS+"/v2"))
			assert.Equal(t, tc.wantState, cloneStatusOf(t, env).State)
			wantTickets("v1", "clone-v2")(t, env) // until the outcome is stored
			fixture.AssertEvents(t, tc.wantEvents, rec)
			c.mu.Lock()
			assert.Len(t, c.results, 1, "the outcome is kept until the cache shows it: a sync on a stale copy must not copy again")
			c.mu.Unlock()

			require.Eventually(t, func() bool {
				v, err := env.DS.Volumes.GetRO("v2")
				return err == nil && v.Status.CloneStatus.State == tc.wantState
			}, 5*time.Second, 10*time.Millisecond)
			require.NoError(t, c.syncClone(context.Background(), fixture.NS+"/v2"))
			wantTickets("v1")(t, env)
			wantTickets("v2")(t, env)
			c.mu.Lock()
			assert.Empty(t, c.results, "forgotten once the cache shows the outcome")
			c.mu.Unlock()
			assert.Len(t, dp.Calls(), 1, "one copy in all")
		})
	}
}

// The snapshot taken of a whole source for a clone goes when the clone's
// target is gone, even though the source (its other owner) stays.
func TestVolumeCloneSnapshotCleanup(t *testing.T) {
	cloneSnap := func(targetUID string) *v1beta1.Snapshot {
		return fixture.Snapshot("clone-v2", true, func(s *v1beta1.Snapshot) {
			s.Finalizers = nil
			s.OwnerReferences = []metav1.OwnerReference{
				{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v2", UID: k8stypes.UID(targetUID)},
				{APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v1", UID: "uid-v1"},
			}
		})
	}
	key := fixture.NS + "/clone-v2"
	cases := []fixture.SyncCase{
		{Name: "the target is gone: the snapshot goes", Objects: fixture.WithNodes(fixture.Volume(), cloneSnap("uid-v2")), Key: key,
			WantWrites: []string{"delete snapshots clone-v2"}},
		{Name: "a new volume of the same name is another target: the snapshot goes",
			Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("vol://v1"), cloneSnap("uid-old")), Key: key,
			WantWrites: []string{"delete snapshots clone-v2"}},
		{Name: "the target is there: kept", Objects: fixture.WithNodes(fixture.Volume(), cloneTarget("vol://v1"), cloneSnap("uid-v2")), Key: key},
		{Name: "already gone: nothing", Objects: fixture.WithNodes(fixture.Volume()), Key: key},
	}
	fixture.RunSyncCases(t, cases, func(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
		c, err := NewVolumeCloneController(logrus.New(), env.DS, rec, me, dp)
		if err != nil {
			return nil, err
		}
		return c.syncCloneSnapshot, nil
	})
}

// A copy starts only when none runs and none has ended unread, checked in
// the same step as the start: a sync that read "not ended" just before the
// first copy ended must not start a second one (it would zero the target
// while the next sync releases the volume as completed).
func TestVolumeCloneRunCopyOnlyOnce(t *testing.T) {
	tests := []struct {
		name        string
		running     bool
		ended       bool
		wantStarted bool
	}{
		{name: "nothing ran: started", wantStarted: true},
		{name: "a copy runs: not started", running: true},
		{name: "a copy ended, its outcome unread: not started", ended: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, fixture.WithNodes(), nil)
			dp := fixture.NewFakeConnector(nil)
			c, err := NewVolumeCloneController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1", dp)
			require.NoError(t, err)
			target := cloneTarget("snap://v1/s1")
			if tc.running {
				c.copies[target.UID] = func() {}
			}
			if tc.ended {
				c.results[target.UID] = copyOutcome{}
			}
			client, err := dp.DataPlane("im-1:8500")
			require.NoError(t, err)
			started := c.runCopy(target, client, engineapi.SnapshotCloneArgs{Engine: "v2-e-0", SourceAddress: "10.0.0.1:v1", Snapshot: "s1"})
			assert.Equal(t, tc.wantStarted, started)
			if tc.wantStarted {
				require.Eventually(t, func() bool { return len(dp.Calls()) == 1 }, 5*time.Second, 10*time.Millisecond)
				return
			}
			assert.Empty(t, dp.Calls(), "no second SnapshotClone")
		})
	}
}

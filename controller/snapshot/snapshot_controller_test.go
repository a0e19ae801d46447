package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func engineWith(state v1beta1.InstanceState, snaps map[string]*v1beta1.SnapshotInfo) *v1beta1.Engine {
	e := fixture.Engine()
	e.Status.CurrentState = state
	e.Status.Snapshots = snaps
	return e
}

func TestEngineSnapshotDiff(t *testing.T) {
	base := fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("s2"))
	tests := []struct {
		name         string
		old, cur     *v1beta1.Engine
		wantChanged  []string
		wantAll      bool
		wantAppeared bool
	}{
		{name: "nothing changed", old: engineWith("running", base), cur: engineWith("running", fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("s2")))},
		{name: "only the head grew: no snapshot concerned",
			old: engineWith("running", base),
			cur: engineWith("running", func() map[string]*v1beta1.SnapshotInfo {
				m := fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("s2"))
				m[types.VolumeHeadName].Size = 1 << 20
				return m
			}())},
		{name: "one entry changed: only that snapshot",
			old:         engineWith("running", base),
			cur:         engineWith("running", fixture.Chain(fixture.SnapInfo("s1", func(i *v1beta1.SnapshotInfo) { i.Removed = true }), fixture.SnapInfo("s2"))),
			wantChanged: []string{"s1"}},
		{name: "a new snapshot appeared: it, and the engine for a CR",
			old:         engineWith("running", base),
			cur:         engineWith("running", fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("s2"), fixture.SnapInfo("s3"))),
			wantChanged: []string{"s3"}, wantAppeared: true},
		{name: "a snapshot vanished: it (it may be lost)",
			old:         engineWith("running", base),
			cur:         engineWith("running", fixture.Chain(fixture.SnapInfo("s2"))),
			wantChanged: []string{"s1"}},
		{name: "engine state changed: every snapshot of the volume",
			old: engineWith("stopped", base), cur: engineWith("running", fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("s2"))), wantAll: true},
		{name: "purge status changed: every snapshot of the volume",
			old: engineWith("running", base),
			cur: func() *v1beta1.Engine {
				e := engineWith("running", fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("s2")))
				e.Status.PurgeStatus = map[string]*v1beta1.PurgeStatus{"r1": {IsPurging: true}}
				return e
			}(), wantAll: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			changed, all, appeared := engineSnapshotDiff(tc.old, tc.cur)
			sort.Strings(changed)
			assert.Equal(t, tc.wantChanged, changed)
			assert.Equal(t, tc.wantAll, all)
			assert.Equal(t, tc.wantAppeared, appeared)
		})
	}
}

// TestSnapshotControllerSync covers the paths that make no gRPC call (a
// detached volume, status mirroring, lost snapshots, releases); taking,
// removing and purging on a running engine are in
// TestSnapshotControllerActionsAgainstRealInstanceManager.
func TestSnapshotControllerSync(t *testing.T) {
	stoppedEngine := func(snaps map[string]*v1beta1.SnapshotInfo) *v1beta1.Engine { return engineWith("stopped", snaps) }
	snapTicket := &v1beta1.AttachmentTicket{ID: "snapshot-s1", Type: v1beta1.AttacherTypeSnapshotController, NodeID: "node-1"}
	tests := []fixture.SyncCase{
		{
			Name:       "requested on a detached volume: a ticket owned by the snapshot asks for an attach",
			Objects:    []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			WantWrites: []string{"update volumeattachments v1"},
			Check: func(t *testing.T, env *dstest.Env) {
				va, err := env.Strata.StrataV1beta1().VolumeAttachments(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
				require.NoError(t, err)
				tk := va.Spec.AttachmentTickets["snapshot-s1"]
				require.NotNil(t, tk)
				assert.Equal(t, v1beta1.AttacherTypeSnapshotController, tk.Type)
				assert.Equal(t, "node-1", tk.NodeID)
				require.NotNil(t, tk.OwnerRef)
				assert.Equal(t, "Snapshot", tk.OwnerRef.Kind)
				assert.Equal(t, "s1", tk.OwnerRef.Name)
			},
		},
		{
			Name:       "taken: status mirrors the chain and the ticket is released",
			Objects:    []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain(fixture.SnapInfo("s1"))), fixture.VA(snapTicket), fixture.Snapshot("s1", true)},
			WantWrites: []string{"update volumeattachments v1", "update snapshots/status s1"},
			Check: func(t *testing.T, env *dstest.Env) {
				s, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(context.Background(), "s1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.True(t, s.Status.ReadyToUse)
				assert.Equal(t, "2026-11-21T11:00:00Z", s.Status.CreationTime)
				assert.Equal(t, int64(8192), s.Status.Size)
				assert.Equal(t, fixture.GiB, s.Status.RestoreSize)
				assert.Equal(t, map[string]bool{types.VolumeHeadName: true}, s.Status.Children)
			},
		},
		{
			Name: "mirrored status unchanged: no write",
			Objects: []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain(fixture.SnapInfo("s1"))), fixture.VA(), fixture.Snapshot("s1", true, func(s *v1beta1.Snapshot) {
				s.Status = v1beta1.SnapshotStatus{OwnerID: "node-1", Children: map[string]bool{types.VolumeHeadName: true}, UserCreated: true,
					CreationTime: "2026-11-21T11:00:00Z", Size: 8192, RestoreSize: fixture.GiB, ReadyToUse: true}
			})},
		},
		{
			Name:       "system snapshot gone from the chain: marked lost, then deleted",
			Objects:    []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", false)},
			WantWrites: []string{"update snapshots/status s1", "delete snapshots s1"},
			WantEvents: []string{"Warning SnapshotLost"},
		},
		{
			Name: "user snapshot taken once and gone: deleted too",
			Objects: []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true, func(s *v1beta1.Snapshot) {
				s.Status.CreationTime = "2026-11-21T11:00:00Z"
			})},
			WantWrites: []string{"update snapshots/status s1", "delete snapshots s1"},
			WantEvents: []string{"Warning SnapshotLost"},
		},
		{
			Name:       "deleting, not in the chain: ticket and finalizer go",
			Objects:    []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain()), fixture.VA(snapTicket), fixture.Snapshot("s1", true, fixture.Deleting)},
			WantWrites: []string{"update volumeattachments v1", "update snapshots s1"},
		},
		{
			Name: "deleting, removed under the head and no purge running: released (a purge only prunes it)",
			Objects: []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain(fixture.SnapInfo("s1", func(i *v1beta1.SnapshotInfo) { i.Removed = true }))),
				fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			WantWrites: []string{"update snapshots s1"},
		},
		{
			Name: "deleting, still in the chain of a detached volume: a ticket to attach for the removal",
			Objects: []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain(fixture.SnapInfo("s1", func(i *v1beta1.SnapshotInfo) {
				i.Children = map[string]bool{"s2": true}
			}), fixture.SnapInfo("s2"))), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			WantWrites: []string{"update volumeattachments v1"},
		},
		{
			Name:       "volume being deleted: the finalizer goes at once",
			Objects:    []runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }), stoppedEngine(fixture.Chain(fixture.SnapInfo("s1"))), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			WantWrites: []string{"update snapshots s1"},
		},
		{
			Name:    "not responsible: the volume's owner is another node",
			Objects: []runtime.Object{fixture.Volume(func(v *v1beta1.Volume) { v.Status.OwnerID = "node-2" }), stoppedEngine(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true, func(s *v1beta1.Snapshot) { s.Status.OwnerID = "" })},
		},
		{
			Name:       "ticket write conflicts: returned for a retry",
			Objects:    []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			APIErr:     &fixture.ReactorError{Verb: "update", Resource: "volumeattachments", Err: errors.New("conflict")},
			WantErr:    "conflict",
			WantWrites: []string{"update volumeattachments v1"},
		},
		{
			Name: "engine monitor: CRs for snapshots without one, none for the head or removed ones",
			Objects: []runtime.Object{fixture.Volume(), stoppedEngine(fixture.Chain(fixture.SnapInfo("s1"), fixture.SnapInfo("sys-1", func(i *v1beta1.SnapshotInfo) { i.UserCreated = false }),
				fixture.SnapInfo("gone", func(i *v1beta1.SnapshotInfo) { i.Removed = true }))), fixture.VA(), fixture.Snapshot("s1", true)},
			Key:        engineKey + fixture.NS + "/v1-e-0",
			WantWrites: []string{"create snapshots sys-1"},
			Check: func(t *testing.T, env *dstest.Env) {
				s, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(context.Background(), "sys-1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.False(t, s.Spec.CreateSnapshot)
				assert.Equal(t, "v1", s.Labels[types.LabelVolume])
				assert.Equal(t, []string{types.FinalizerName}, s.Finalizers)
				require.Len(t, s.OwnerReferences, 1)
				assert.Equal(t, "uid-v1", string(s.OwnerReferences[0].UID))
			},
		},
	}
	runSnapshotCases(t, tests)
}

// runSnapshotCases runs snapshot controller cases on three schedulable nodes;
// the key defaults to snapshot s1.
func runSnapshotCases(t *testing.T, cases []fixture.SyncCase) {
	t.Helper()
	nodes := []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3")}
	for i := range cases {
		cases[i].Objects = append(append([]runtime.Object{}, nodes...), cases[i].Objects...)
		cases[i].Key = cmp.Or(cases[i].Key, fixture.NS+"/s1")
	}
	fixture.RunSyncCases(t, cases, func(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error) {
		c, err := NewSnapshotController(logrus.New(), env.DS, rec, me, dp)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, key string) error {
			if engine, ok := strings.CutPrefix(key, engineKey); ok {
				return c.syncEngineSnapshots(ctx, engine)
			}
			return c.syncSnapshot(ctx, key)
		}, nil
	})
}

// engineKey marks a case's key as one of the engine queue's.
const engineKey = "engine:"

// TestSnapshotControllerActs drives the paths that act through the data
// plane — take, remove, purge — against the in-memory data plane, with the
// errors the instance manager can answer.
func TestSnapshotControllerActs(t *testing.T) {
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Spec:   v1beta1.InstanceManagerSpec{NodeID: "node-1"},
		Status: v1beta1.InstanceManagerStatus{CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-node-1:8500"}}
	attached := func() *v1beta1.Volume { return fixture.Volume(fixture.AttachedOn("node-1")) }
	running := func(snaps map[string]*v1beta1.SnapshotInfo) *v1beta1.Engine {
		return fixture.Engine(fixture.EngineRunningOn("node-1", fixture.AllRW()), func(e *v1beta1.Engine) { e.Status.Snapshots = snaps })
	}
	// s1 under s2: a purge coalesces it, so the finalizer waits for that.
	s1UnderS2 := fixture.Chain(fixture.SnapInfo("s1", func(i *v1beta1.SnapshotInfo) { i.Children = map[string]bool{"s2": true} }), fixture.SnapInfo("s2"))
	statusError := func(want string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) {
			s, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(context.Background(), "s1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Contains(t, s.Status.Error, want)
		}
	}
	runSnapshotCases(t, []fixture.SyncCase{
		{
			Name:       "requested on an attached volume: the engine takes it",
			Objects:    []runtime.Object{im, attached(), running(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 true"},
			WantEvents: []string{"Normal SnapshotCreated"},
		},
		{
			Name:       "requested on a detached volume: no call, a ticket asks for an attach",
			Objects:    []runtime.Object{im, fixture.Volume(), engineWith("stopped", fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			WantWrites: []string{"update volumeattachments v1"},
		},
		{
			Name:      "the engine has it already (a retry): not taken twice, no event",
			Objects:   []runtime.Object{im, attached(), running(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			DPErr:     map[string]error{"SnapshotCreate": fmt.Errorf("snapshot s1 exists: %w", engineapi.ErrAlreadyExists)},
			WantCalls: []string{"SnapshotCreate v1-e-0 s1 true"},
		},
		{
			Name:       "over the volume's snapshot limit: the status says why, no retry",
			Objects:    []runtime.Object{im, attached(), running(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			DPErr:      map[string]error{"SnapshotCreate": fmt.Errorf("250 user snapshots: %w", engineapi.ErrLimitExceeded)},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 true"},
			WantWrites: []string{"update snapshots/status s1"},
			WantEvents: []string{"Warning SnapshotFailed"},
			Check:      statusError("250 user snapshots"),
		},
		{
			Name:      "the instance manager fails the take: returned for a retry",
			Objects:   []runtime.Object{im, attached(), running(fixture.Chain()), fixture.VA(), fixture.Snapshot("s1", true)},
			DPErr:     map[string]error{"SnapshotCreate": fmt.Errorf("replica r2: %w", engineapi.ErrUnavailable)},
			WantErr:   "taking snapshot s1",
			WantCalls: []string{"SnapshotCreate v1-e-0 s1 true"},
		},
		{
			Name:       "deleted while in the chain of a running engine: removed, then purged",
			Objects:    []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			WantCalls:  []string{"SnapshotRemove v1-e-0 s1", "SnapshotPurge v1-e-0"},
			WantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			Name: "deleted while a backup reads it: kept in the chain, an event names the backup",
			Objects: []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting),
				fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStateInProgress, 40))},
			WantEvents: []string{"Normal WaitingForReaders"},
		},
		{
			Name: "deleted after its backup finished: removed, then purged",
			Objects: []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting),
				fixture.Backup("b1", "s1", fixture.BackupState(v1beta1.BackupStateCompleted, 100))},
			WantCalls:  []string{"SnapshotRemove v1-e-0 s1", "SnapshotPurge v1-e-0"},
			WantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			Name: "already removed: only the purge",
			Objects: []runtime.Object{im, attached(), running(fixture.Chain(fixture.SnapInfo("s1", func(i *v1beta1.SnapshotInfo) {
				i.Removed, i.Children = true, map[string]bool{"s2": true}
			}), fixture.SnapInfo("s2"))), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			WantCalls: []string{"SnapshotPurge v1-e-0"},
		},
		{
			Name:       "a purge that fails is returned for a retry",
			Objects:    []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			DPErr:      map[string]error{"SnapshotPurge": errors.New("no space left on device")},
			WantErr:    "purging volume v1: no space left on device",
			WantCalls:  []string{"SnapshotRemove v1-e-0 s1", "SnapshotPurge v1-e-0"},
			WantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			Name:       "busy engine (a purge runs): left to finish, its end enqueues the snapshot",
			Objects:    []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			DPErr:      map[string]error{"SnapshotPurge": fmt.Errorf("purge running: %w", engineapi.ErrBusy)},
			WantCalls:  []string{"SnapshotRemove v1-e-0 s1", "SnapshotPurge v1-e-0"},
			WantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			Name:      "removing fails: no purge, returned for a retry",
			Objects:   []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting)},
			DPErr:     map[string]error{"SnapshotRemove": fmt.Errorf("replica r1: %w", engineapi.ErrUnavailable)},
			WantErr:   "removing snapshot s1",
			WantCalls: []string{"SnapshotRemove v1-e-0 s1"},
		},
		{
			Name: "purge disabled by the setting: removed, not purged",
			Objects: []runtime.Object{im, attached(), running(s1UnderS2), fixture.VA(), fixture.Snapshot("s1", true, fixture.Deleting),
				&v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingDisableSnapshotPurge), Namespace: fixture.NS}, Value: "true"}},
			WantCalls:  []string{"SnapshotRemove v1-e-0 s1"},
			WantEvents: []string{"Normal SnapshotRemoved"},
		},
	})
}

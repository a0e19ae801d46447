package controller

import (
	"context"
	"errors"
	"sort"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func chain(entries ...*v1beta1.SnapshotInfo) map[string]*v1beta1.SnapshotInfo {
	m := map[string]*v1beta1.SnapshotInfo{VolumeHeadName: {Name: VolumeHeadName, Size: 4096}}
	for _, e := range entries {
		m[e.Name] = e
	}
	return m
}

func snapInfo(name string, mut ...func(*v1beta1.SnapshotInfo)) *v1beta1.SnapshotInfo {
	i := &v1beta1.SnapshotInfo{Name: name, UserCreated: true, Created: "2026-11-21T11:00:00Z", Size: 8192,
		Children: map[string]bool{VolumeHeadName: true}}
	for _, m := range mut {
		m(i)
	}
	return i
}

func engineWith(state v1beta1.InstanceState, snaps map[string]*v1beta1.SnapshotInfo) *v1beta1.Engine {
	e := vcEngine()
	e.Status.CurrentState = state
	e.Status.Snapshots = snaps
	return e
}

func TestEngineSnapshotDiff(t *testing.T) {
	base := chain(snapInfo("s1"), snapInfo("s2"))
	tests := []struct {
		name         string
		old, cur     *v1beta1.Engine
		wantChanged  []string
		wantAll      bool
		wantAppeared bool
	}{
		{name: "nothing changed", old: engineWith("running", base), cur: engineWith("running", chain(snapInfo("s1"), snapInfo("s2")))},
		{name: "only the head grew: no snapshot concerned",
			old: engineWith("running", base),
			cur: engineWith("running", func() map[string]*v1beta1.SnapshotInfo {
				m := chain(snapInfo("s1"), snapInfo("s2"))
				m[VolumeHeadName].Size = 1 << 20
				return m
			}())},
		{name: "one entry changed: only that snapshot",
			old:         engineWith("running", base),
			cur:         engineWith("running", chain(snapInfo("s1", func(i *v1beta1.SnapshotInfo) { i.Removed = true }), snapInfo("s2"))),
			wantChanged: []string{"s1"}},
		{name: "a new snapshot appeared: it, and the engine for a CR",
			old:         engineWith("running", base),
			cur:         engineWith("running", chain(snapInfo("s1"), snapInfo("s2"), snapInfo("s3"))),
			wantChanged: []string{"s3"}, wantAppeared: true},
		{name: "a snapshot vanished: it (it may be lost)",
			old:         engineWith("running", base),
			cur:         engineWith("running", chain(snapInfo("s2"))),
			wantChanged: []string{"s1"}},
		{name: "engine state changed: every snapshot of the volume",
			old: engineWith("stopped", base), cur: engineWith("running", chain(snapInfo("s1"), snapInfo("s2"))), wantAll: true},
		{name: "purge status changed: every snapshot of the volume",
			old: engineWith("running", base),
			cur: func() *v1beta1.Engine {
				e := engineWith("running", chain(snapInfo("s1"), snapInfo("s2")))
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

func testSnapshot(name string, create bool, mut ...func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	s := &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: "uid-" + "snap-" + "x",
			Labels: map[string]string{types.LabelVolume: "v1"}, Finalizers: []string{types.FinalizerName}},
		Spec:   v1beta1.SnapshotSpec{Volume: "v1", CreateSnapshot: create},
		Status: v1beta1.SnapshotStatus{OwnerID: "node-1"},
	}
	for _, m := range mut {
		m(s)
	}
	return s
}

func deleting(s *v1beta1.Snapshot) { now := metav1.NewTime(dstest.Now); s.DeletionTimestamp = &now }

func testVA(tickets ...*v1beta1.AttachmentTicket) *v1beta1.VolumeAttachment {
	va := &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "v1", Namespace: testNS},
		Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: map[string]*v1beta1.AttachmentTicket{}}}
	for _, t := range tickets {
		va.Spec.AttachmentTickets[t.ID] = t
	}
	return va
}

// TestSnapshotControllerSync covers the paths that make no gRPC call (a
// detached volume, status mirroring, lost snapshots, releases); taking,
// removing and purging on a running engine are in
// TestSnapshotControllerActionsAgainstRealInstanceManager.
func TestSnapshotControllerSync(t *testing.T) {
	stoppedEngine := func(snaps map[string]*v1beta1.SnapshotInfo) *v1beta1.Engine { return engineWith("stopped", snaps) }
	snapTicket := &v1beta1.AttachmentTicket{ID: "snapshot-s1", Type: v1beta1.AttacherTypeSnapshotController, NodeID: "node-1"}
	tests := []struct {
		name       string
		objects    []runtime.Object
		key        string
		apiErr     *reactorError
		wantErr    string
		wantWrites []string
		wantEvents []string
		check      func(t *testing.T, env *dstest.Env)
	}{
		{
			name:       "requested on a detached volume: a ticket owned by the snapshot asks for an attach",
			objects:    []runtime.Object{vcVolume(), stoppedEngine(chain()), testVA(), testSnapshot("s1", true)},
			wantWrites: []string{"update volumeattachments v1"},
			check: func(t *testing.T, env *dstest.Env) {
				va, err := env.Strata.StrataV1beta1().VolumeAttachments(testNS).Get(context.Background(), "v1", metav1.GetOptions{})
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
			name:       "taken: status mirrors the chain and the ticket is released",
			objects:    []runtime.Object{vcVolume(), stoppedEngine(chain(snapInfo("s1"))), testVA(snapTicket), testSnapshot("s1", true)},
			wantWrites: []string{"update volumeattachments v1", "update snapshots/status s1"},
			check: func(t *testing.T, env *dstest.Env) {
				s, err := env.Strata.StrataV1beta1().Snapshots(testNS).Get(context.Background(), "s1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.True(t, s.Status.ReadyToUse)
				assert.Equal(t, "2026-11-21T11:00:00Z", s.Status.CreationTime)
				assert.Equal(t, int64(8192), s.Status.Size)
				assert.Equal(t, gib, s.Status.RestoreSize)
				assert.Equal(t, map[string]bool{VolumeHeadName: true}, s.Status.Children)
			},
		},
		{
			name: "mirrored status unchanged: no write",
			objects: []runtime.Object{vcVolume(), stoppedEngine(chain(snapInfo("s1"))), testVA(), testSnapshot("s1", true, func(s *v1beta1.Snapshot) {
				s.Status = v1beta1.SnapshotStatus{OwnerID: "node-1", Children: map[string]bool{VolumeHeadName: true}, UserCreated: true,
					CreationTime: "2026-11-21T11:00:00Z", Size: 8192, RestoreSize: gib, ReadyToUse: true}
			})},
		},
		{
			name:       "system snapshot gone from the chain: marked lost, then deleted",
			objects:    []runtime.Object{vcVolume(), stoppedEngine(chain()), testVA(), testSnapshot("s1", false)},
			wantWrites: []string{"update snapshots/status s1", "delete snapshots s1"},
			wantEvents: []string{"Warning SnapshotLost"},
		},
		{
			name: "user snapshot taken once and gone: deleted too",
			objects: []runtime.Object{vcVolume(), stoppedEngine(chain()), testVA(), testSnapshot("s1", true, func(s *v1beta1.Snapshot) {
				s.Status.CreationTime = "2026-11-21T11:00:00Z"
			})},
			wantWrites: []string{"update snapshots/status s1", "delete snapshots s1"},
			wantEvents: []string{"Warning SnapshotLost"},
		},
		{
			name:       "deleting, not in the chain: ticket and finalizer go",
			objects:    []runtime.Object{vcVolume(), stoppedEngine(chain()), testVA(snapTicket), testSnapshot("s1", true, deleting)},
			wantWrites: []string{"update volumeattachments v1", "update snapshots s1"},
		},
		{
			name: "deleting, removed under the head and no purge running: released (a purge only prunes it)",
			objects: []runtime.Object{vcVolume(), stoppedEngine(chain(snapInfo("s1", func(i *v1beta1.SnapshotInfo) { i.Removed = true }))),
				testVA(), testSnapshot("s1", true, deleting)},
			wantWrites: []string{"update snapshots s1"},
		},
		{
			name: "deleting, still in the chain of a detached volume: a ticket to attach for the removal",
			objects: []runtime.Object{vcVolume(), stoppedEngine(chain(snapInfo("s1", func(i *v1beta1.SnapshotInfo) {
				i.Children = map[string]bool{"s2": true}
			}), snapInfo("s2"))), testVA(), testSnapshot("s1", true, deleting)},
			wantWrites: []string{"update volumeattachments v1"},
		},
		{
			name:       "volume being deleted: the finalizer goes at once",
			objects:    []runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.DeletionTimestamp = &metav1.Time{Time: dstest.Now} }), stoppedEngine(chain(snapInfo("s1"))), testVA(), testSnapshot("s1", true, deleting)},
			wantWrites: []string{"update snapshots s1"},
		},
		{
			name:    "not responsible: the volume's owner is another node",
			objects: []runtime.Object{vcVolume(func(v *v1beta1.Volume) { v.Status.OwnerID = "node-2" }), stoppedEngine(chain()), testVA(), testSnapshot("s1", true, func(s *v1beta1.Snapshot) { s.Status.OwnerID = "" })},
		},
		{
			name:       "ticket write conflicts: returned for a retry",
			objects:    []runtime.Object{vcVolume(), stoppedEngine(chain()), testVA(), testSnapshot("s1", true)},
			apiErr:     &reactorError{"update", "volumeattachments", "", errors.New("conflict")},
			wantErr:    "conflict",
			wantWrites: []string{"update volumeattachments v1"},
		},
		{
			name: "engine monitor: CRs for snapshots without one, none for the head or removed ones",
			objects: []runtime.Object{vcVolume(), stoppedEngine(chain(snapInfo("s1"), snapInfo("sys-1", func(i *v1beta1.SnapshotInfo) { i.UserCreated = false }),
				snapInfo("gone", func(i *v1beta1.SnapshotInfo) { i.Removed = true }))), testVA(), testSnapshot("s1", true)},
			key:        engineKeyPrefix + testNS + "/v1-e-0",
			wantWrites: []string{"create snapshots sys-1"},
			check: func(t *testing.T, env *dstest.Env) {
				s, err := env.Strata.StrataV1beta1().Snapshots(testNS).Get(context.Background(), "sys-1", metav1.GetOptions{})
				require.NoError(t, err)
				assert.False(t, s.Spec.CreateSnapshot)
				assert.Equal(t, "v1", s.Labels[types.LabelVolume])
				assert.Equal(t, []string{types.FinalizerName}, s.Finalizers)
				require.Len(t, s.OwnerReferences, 1)
				assert.Equal(t, "uid-v1", string(s.OwnerReferences[0].UID))
			},
		},
	}
	leases := []runtime.Object{testLease("node-1", 0), testLease("node-2", 0), testLease("node-3", 0)}
	nodes := []runtime.Object{schedNode("node-1"), schedNode("node-2"), schedNode("node-3")}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, append(append([]runtime.Object{}, nodes...), tc.objects...), leases)
			if tc.apiErr != nil {
				tc.apiErr.install(env.Strata)
			}
			rec := record.NewFakeRecorder(20)
			c, err := NewSnapshotController(logrus.New(), env.DS, rec, "node-1", engineapi.NewPool(0))
			require.NoError(t, err)
			env.ClearActions()
			key := tc.key
			if key == "" {
				key = testNS + "/s1"
			}
			err = c.syncKey(context.Background(), key)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWrites, writes(env.Strata.Actions()))
			assertEvents(t, tc.wantEvents, rec)
			if tc.check != nil {
				tc.check(t, env)
			}
		})
	}
}

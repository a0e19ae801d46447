package volume

import (
	"context"
	"slices"
	"testing"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestSnapshotLimitCondition(t *testing.T) {
	tests := []struct {
		name              string
		maxCount          int32
		maxSize           int64
		userCount         int
		size              int64
		wantTrue          bool
		wantReason, wantM string
	}{
		{name: "far from both limits", maxCount: 250, maxSize: 2 * fixture.GiB, userCount: 3, size: 100 * fixture.MiB,
			wantReason: "WithinLimits", wantM: "under 250 user snapshots (spec.snapshotMaxCount); under 2Gi of snapshots (spec.snapshotMaxSize)"},
		{name: "no size limit", maxCount: 250, userCount: 0, size: 0,
			wantReason: "WithinLimits", wantM: "under 250 user snapshots (spec.snapshotMaxCount); no size limit"},
		{name: "no limit at all (the setting could not be read)", userCount: 7, size: 3 * fixture.GiB,
			wantReason: "WithinLimits", wantM: "no count limit; no size limit"},
		{name: "at the count limit: the next one is refused", maxCount: 4, userCount: 4, wantTrue: true,
			wantReason: "CountLimitReached",
			wantM:      "4 of 4 user snapshots (spec.snapshotMaxCount): the next user snapshot will be refused; snapshots hold 0B, no size limit"},
		{name: "past the count limit (lowered while over, or the setting fell)", maxCount: 4, userCount: 6, wantTrue: true,
			wantReason: "CountLimitReached",
			wantM:      "6 of 4 user snapshots (spec.snapshotMaxCount): the next user snapshot will be refused; snapshots hold 0B, no size limit"},
		{name: "one snapshot left under the count limit", maxCount: 4, userCount: 3, wantTrue: true,
			wantReason: "CountLimitNear",
			wantM:      "3 of 4 user snapshots (spec.snapshotMaxCount): one more is allowed; snapshots hold 0B, no size limit"},
		{name: "two left: not near", maxCount: 4, userCount: 2,
			wantReason: "WithinLimits", wantM: "under 4 user snapshots (spec.snapshotMaxCount); no size limit"},
		{name: "at the size limit", maxCount: 250, maxSize: 2 * fixture.GiB, userCount: 1, size: 2 * fixture.GiB, wantTrue: true,
			wantReason: "SizeLimitReached",
			wantM:      "1 of 250 user snapshots; snapshots hold 2Gi of 2Gi (spec.snapshotMaxSize): the next user snapshot will be refused"},
		{name: "a byte under the size limit reads under it", maxCount: 250, maxSize: 2 * fixture.GiB, userCount: 1, size: 2*fixture.GiB - 1,
			wantTrue: true, wantReason: "SizeLimitNear",
			wantM: "1 of 250 user snapshots; snapshots hold 1.9Gi of 2Gi (spec.snapshotMaxSize): 90% or more used"},
		{name: "90% of the size limit", maxCount: 250, maxSize: 10 * fixture.GiB, userCount: 1, size: 9 * fixture.GiB, wantTrue: true,
			wantReason: "SizeLimitNear",
			wantM:      "1 of 250 user snapshots; snapshots hold 9Gi of 10Gi (spec.snapshotMaxSize): 90% or more used"},
		{name: "just under 90%", maxCount: 250, maxSize: 10 * fixture.GiB, userCount: 1, size: 9*fixture.GiB - 1,
			wantReason: "WithinLimits", wantM: "under 250 user snapshots (spec.snapshotMaxCount); under 10Gi of snapshots (spec.snapshotMaxSize)"},
		{name: "count reached and size near: the refusal comes first", maxCount: 2, maxSize: 10 * fixture.GiB, userCount: 2, size: 9 * fixture.GiB,
			wantTrue: true, wantReason: "CountLimitReached",
			wantM: "2 of 2 user snapshots (spec.snapshotMaxCount): the next user snapshot will be refused; snapshots hold 9Gi of 10Gi"},
		{name: "size reached and count near: the refusal comes first", maxCount: 3, maxSize: 2 * fixture.GiB, userCount: 2, size: 2 * fixture.GiB,
			wantTrue: true, wantReason: "SizeLimitReached",
			wantM: "2 of 3 user snapshots; snapshots hold 2Gi of 2Gi (spec.snapshotMaxSize): the next user snapshot will be refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason, msg := snapshotLimitCondition(tc.maxCount, tc.maxSize, tc.userCount, tc.size)
			assert.Equal(t, tc.wantTrue, ok)
			assert.Equal(t, tc.wantReason, reason)
			assert.Equal(t, tc.wantM, msg)
		})
	}
}

// withActualSizeOf gives the volume the actualSize the engine's chain makes,
// as reported before.
func withActualSizeOf(v *v1beta1.Volume, e *v1beta1.Engine) *v1beta1.Volume {
	sp, _ := e.Status.Space()
	v.Status.ActualSize = sp.Total()
	v.Status.HeadSize, v.Status.SnapshotsSize, v.Status.RemovedSnapshotsSize = sp.Head, sp.Snapshots, sp.Removed
	return v
}

// TestVolumeSnapshotLimitCondition: the volume controller sets the
// condition from the engine's cached chain, warns when it turns True or
// moves to a refusal, and writes nothing when it is unchanged.
func TestVolumeSnapshotLimitCondition(t *testing.T) {
	volume := func(maxCount int32, cond *metav1.Condition) *v1beta1.Volume {
		return fixture.Volume(fixture.AttachedOn("node-1"), func(v *v1beta1.Volume) {
			v.Spec.SnapshotMaxCount = maxCount
			if cond != nil {
				cond.LastTransitionTime = metav1.NewTime(dstest.Now)
				v.Status.Conditions = slices.DeleteFunc(v.Status.Conditions, func(c metav1.Condition) bool {
					return c.Type == v1beta1.VolumeConditionSnapshotLimit
				})
				v.Status.Conditions = append(v.Status.Conditions, *cond)
			}
		})
	}
	engine := func(maxCount int32, userSnapshots int) *v1beta1.Engine {
		return fixture.Engine(fixture.EngineRunningOn("node-1", fixture.AllRW()), func(e *v1beta1.Engine) {
			e.Spec.SnapshotMaxCount = maxCount
			e.Status.Snapshots = fixture.LimitedChain(userSnapshots)
		})
	}
	condition := func(t *testing.T, env *dstest.Env) *metav1.Condition {
		v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
		require.NoError(t, err)
		c := meta.FindStatusCondition(v.Status.Conditions, v1beta1.VolumeConditionSnapshotLimit)
		require.NotNil(t, c)
		return c
	}
	conditionIs := func(status metav1.ConditionStatus, reason, message string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) {
			c := condition(t, env)
			assert.Equal(t, status, c.Status)
			assert.Equal(t, reason, c.Reason)
			assert.Equal(t, message, c.Message)
		}
	}
	near := &metav1.Condition{Type: v1beta1.VolumeConditionSnapshotLimit, Status: metav1.ConditionTrue, Reason: "CountLimitNear",
		Message: "1 of 2 user snapshots (spec.snapshotMaxCount): one more is allowed; snapshots hold 3Mi, no size limit"}
	reached := &metav1.Condition{Type: v1beta1.VolumeConditionSnapshotLimit, Status: metav1.ConditionTrue, Reason: "CountLimitReached",
		Message: "2 of 2 user snapshots (spec.snapshotMaxCount): the next user snapshot will be refused; snapshots hold 4Mi, no size limit"}
	setting := &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingSnapshotMaxCount), Namespace: fixture.NS}, Value: "3"}
	nodes := []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3")}
	tests := []fixture.SyncCase{
		{Name: "one user snapshot left: True, a warning",
			Objects:    []runtime.Object{volume(2, nil), engine(2, 1)},
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning SnapshotLimit"},
			Check: conditionIs(metav1.ConditionTrue, "CountLimitNear", near.Message)},
		{Name: "near, then at the limit: a warning again",
			Objects:    []runtime.Object{volume(2, near.DeepCopy()), engine(2, 2)},
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning SnapshotLimit"},
			Check: conditionIs(metav1.ConditionTrue, "CountLimitReached", reached.Message)},
		{Name: "at the limit and unchanged: no write, no event",
			Objects: []runtime.Object{withActualSizeOf(volume(2, reached.DeepCopy()), engine(2, 2)), engine(2, 2)}},
		{Name: "a snapshot deleted (and purged): False again, no event",
			Objects:    []runtime.Object{volume(5, reached.DeepCopy()), engine(5, 1)},
			WantWrites: []string{"update volumes/status v1"},
			Check:      conditionIs(metav1.ConditionFalse, "WithinLimits", "under 5 user snapshots (spec.snapshotMaxCount); no size limit")},
		{Name: "a volume stored without a count (0): the setting's count is judged, and handed to the engine",
			Objects:    []runtime.Object{setting, volume(0, nil), engine(250, 2)},
			WantWrites: []string{"update engines v1-e-0", "update volumes/status v1"}, WantEvents: []string{"Warning SnapshotLimit"},
			Check: fixture.AllChecks(
				conditionIs(metav1.ConditionTrue, "CountLimitNear",
					"2 of 3 user snapshots (spec.snapshotMaxCount): one more is allowed; snapshots hold 4Mi, no size limit"),
				func(t *testing.T, env *dstest.Env) {
					e, err := env.Strata.StrataV1beta1().Engines(fixture.NS).Get(context.Background(), "v1-e-0", metav1.GetOptions{})
					require.NoError(t, err)
					assert.Equal(t, int32(3), e.Spec.SnapshotMaxCount)
				})},
		{Name: "the size limit is judged with removed and system snapshots",
			Objects: []runtime.Object{
				fixture.Volume(fixture.AttachedOn("node-1"), func(v *v1beta1.Volume) {
					v.Spec.SnapshotMaxCount, v.Spec.SnapshotMaxSize = 250, resource.MustParse("4Mi")
				}),
				fixture.Engine(fixture.EngineRunningOn("node-1", fixture.AllRW()), func(e *v1beta1.Engine) {
					e.Spec.SnapshotMaxSize, e.Status.Snapshots = 4*fixture.MiB, fixture.LimitedChain(2)
				}),
			},
			WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning SnapshotLimit"},
			Check: conditionIs(metav1.ConditionTrue, "SizeLimitReached",
				"2 of 250 user snapshots; snapshots hold 4Mi of 4Mi (spec.snapshotMaxSize): the next user snapshot will be refused")},
	}
	for i := range tests {
		tests[i].Objects = append(append([]runtime.Object{}, nodes...), tests[i].Objects...)
		// The three replicas the engine runs with, healthy.
		tests[i].Objects = append(tests[i].Objects, fixture.ThreeReplicas(fixture.ReplicaRunning)...)
	}
	fixture.RunSyncCases(t, tests, volumeSyncer)
}

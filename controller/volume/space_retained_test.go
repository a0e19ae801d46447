package volume

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestSpaceRetainedConditionTable(t *testing.T) {
	tests := []struct {
		name          string
		noPurge       bool
		held          int64
		removed       []string
		want          bool
		reason, wantM string
	}{
		{"purge on: nothing to say", false, 64 << 20, []string{"s1"}, false, "PurgeEnabled", "deleted snapshots' data is freed by a purge"},
		{"purge off, nothing held", true, 0, nil, false, "NothingRetained",
			"snapshot purge is disabled; no deleted snapshot holds data a purge would free"},
		{"purge off, data held: named with its bytes", true, 64 << 20, []string{"s2", "s1"}, true, "PurgeDisabled",
			"deleted snapshots s1, s2 hold 64Mi (67108864 bytes) that a purge would free; snapshot purge is disabled (setting disable-snapshot-purge)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason, message := spaceRetainedCondition(tc.noPurge, tc.held, tc.removed)
			assert.Equal(t, tc.want, ok)
			assert.Equal(t, tc.reason, reason)
			assert.Equal(t, tc.wantM, message)
		})
	}
}

// TestVolumeSpaceRetainedCondition: a removed snapshot the engine reports
// holding data turns the condition True, with a warning, while snapshot
// purge is disabled.
func TestVolumeSpaceRetainedCondition(t *testing.T) {
	engine := fixture.Engine(fixture.EngineRunningOn("node-1", fixture.AllRW()), func(e *v1beta1.Engine) {
		e.Status.Snapshots = map[string]*v1beta1.SnapshotInfo{
			types.VolumeHeadName: {Name: types.VolumeHeadName, Parent: "s1"},
			"s1":                 {Name: "s1", Removed: true, Size: 8 << 20, Exclusive: 8 << 20, Children: map[string]bool{types.VolumeHeadName: true}},
		}
	})
	noPurge := &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingDisableSnapshotPurge), Namespace: fixture.NS}, Value: "true"}
	nodes := []runtime.Object{fixture.SchedNode("node-1"), fixture.SchedNode("node-2"), fixture.SchedNode("node-3")}
	objects := append(append(append([]runtime.Object{}, nodes...), noPurge, fixture.Volume(fixture.AttachedOn("node-1")), engine),
		fixture.ThreeReplicas(fixture.ReplicaRunning)...)
	fixture.RunSyncCases(t, []fixture.SyncCase{{
		Name: "purge disabled, a deleted snapshot holding 8Mi", Objects: objects,
		WantWrites: []string{"update volumes/status v1"}, WantEvents: []string{"Warning SnapshotSpaceRetained"},
		Check: func(t *testing.T, env *dstest.Env) {
			v, err := env.Strata.StrataV1beta1().Volumes(fixture.NS).Get(context.Background(), "v1", metav1.GetOptions{})
			require.NoError(t, err)
			c := meta.FindStatusCondition(v.Status.Conditions, v1beta1.VolumeConditionSnapshotSpaceRetained)
			require.NotNil(t, c)
			assert.Equal(t, metav1.ConditionTrue, c.Status)
			assert.Contains(t, c.Message, "deleted snapshots s1 hold 8Mi")
			assert.EqualValues(t, 8<<20, v.Status.RemovedSnapshotsSize)
		},
	}}, volumeSyncer)
}

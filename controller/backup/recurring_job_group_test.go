package backup

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// jobGroup is a SnapshotGroup job made at hhmmss, in state.
func jobGroup(job, hhmmss string, state v1beta1.SnapshotGroupState) *v1beta1.SnapshotGroup {
	return &v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: jobObjName(job, groupVolumeName, hhmmss),
		Namespace: types.DefaultNamespace, Labels: map[string]string{types.LabelRecurringJob: job},
		CreationTimestamp: metav1.NewTime(at(hhmmss))},
		Spec: v1beta1.SnapshotGroupSpec{Volumes: []string{"v1"}}, Status: v1beta1.SnapshotGroupStatus{State: state}}
}

// A snapshot-group run makes one SnapshotGroup of every selected volume,
// labelled for the job, waits for it, and keeps the job's newest retain
// Ready groups.
func TestRecurringJobGroupRun(t *testing.T) {
	const now = "12:00:00"
	cases := []struct {
		name       string
		cutState   v1beta1.SnapshotGroupState
		objects    []runtime.Object
		wantErr    string
		wantGroups []string
	}{
		{name: "one cut of all, the oldest past retain and a failed older one deleted", cutState: v1beta1.SnapshotGroupReady,
			objects: []runtime.Object{jobGroup("grp", "10:00:00", v1beta1.SnapshotGroupReady),
				jobGroup("grp", "09:00:00", v1beta1.SnapshotGroupFailed), jobGroup("grp", "11:00:00", v1beta1.SnapshotGroupReady),
				jobGroup("other", "08:00:00", v1beta1.SnapshotGroupReady)},
			wantGroups: []string{jobObjName("grp", groupVolumeName, "11:00:00"), jobObjName("grp", groupVolumeName, now),
				jobObjName("other", groupVolumeName, "08:00:00")}},
		{name: "a failed cut fails the run and prunes nothing", cutState: v1beta1.SnapshotGroupFailed,
			objects: []runtime.Object{jobGroup("grp", "10:00:00", v1beta1.SnapshotGroupReady),
				jobGroup("grp", "11:00:00", v1beta1.SnapshotGroupReady)},
			wantErr: "snapshot group " + jobObjName("grp", groupVolumeName, now) + ": volume v9 is gone",
			wantGroups: []string{jobObjName("grp", groupVolumeName, "10:00:00"), jobObjName("grp", groupVolumeName, "11:00:00"),
				jobObjName("grp", groupVolumeName, now)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := testJob("grp", v1beta1.RecurringJobTaskSnapshotGroup, "@hourly", 2, func(j *v1beta1.RecurringJob) {
				j.Spec.Groups, j.Spec.Labels = []string{"db"}, map[string]string{"team": "db"}
			})
			objs := append(slices.Clone(tc.objects), job,
				labelledVolume("v2", enabled(types.RecurringJobGroupLabel("db"))),
				labelledVolume("v1", enabled(types.RecurringJobGroupLabel("db"))),
				labelledVolume("v3", nil))
			env := dstest.New(t, objs, []runtime.Object{fixture.Lease("node-1", 0)})
			var made *v1beta1.SnapshotGroup
			env.Strata.PrependReactor("create", "snapshotgroups", func(a k8stesting.Action) (bool, runtime.Object, error) {
				made = a.(k8stesting.CreateAction).GetObject().(*v1beta1.SnapshotGroup).DeepCopy()
				g := a.(k8stesting.CreateAction).GetObject().(*v1beta1.SnapshotGroup)
				g.Status.State, g.CreationTimestamp = tc.cutState, metav1.NewTime(env.Clock.Now())
				if tc.cutState == v1beta1.SnapshotGroupFailed {
					g.Status.Error = "volume v9 is gone"
				}
				return false, nil, nil
			})
			c := newRecurringJobController(t, env, record.NewFakeRecorder(50), "node-1", fixture.NewFakeConnector(nil))
			out := c.runJob(context.Background(), c.Logger, job, at(now))
			if tc.wantErr != "" {
				require.Error(t, out.err)
				assert.Contains(t, out.err.Error(), tc.wantErr)
			} else {
				require.NoError(t, out.err)
			}
			assert.Equal(t, 2, out.volumes)
			require.NotNil(t, made)
			assert.Equal(t, []string{"v1", "v2"}, made.Spec.Volumes, "one group of both selected volumes")
			assert.Equal(t, map[string]string{"team": "db", types.LabelRecurringJob: "grp"}, made.Labels)
			assert.Equal(t, made.Labels, made.Spec.Labels, "the members carry the job's labels")
			list, err := env.Strata.StrataV1beta1().SnapshotGroups(types.DefaultNamespace).List(context.Background(), metav1.ListOptions{})
			require.NoError(t, err)
			var names []string
			for _, g := range list.Items {
				names = append(names, g.Name)
			}
			slices.Sort(names)
			want := slices.Sorted(slices.Values(tc.wantGroups))
			assert.Equal(t, want, names, "groups left")
		})
	}
}

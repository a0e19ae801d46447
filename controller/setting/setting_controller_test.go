package setting

import (
	"context"
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestSettingControllerSync(t *testing.T) {
	alive := []runtime.Object{fixture.Node("node-1", nil)}
	tests := []struct {
		name       string
		setting    *v1beta1.Setting
		aliveNodes []runtime.Object
		apiErr     *fixture.ReactorError
		wantErr    string
		wantStatus v1beta1.SettingStatus
		wantWrites []string
		wantEvents []string
	}{
		{
			name:       "valid value is marked applied",
			setting:    fixture.Setting(types.SettingDefaultReplicaCount, "2", v1beta1.SettingStatus{}),
			wantStatus: v1beta1.SettingStatus{Applied: true},
			wantWrites: []string{"update settings/status default-replica-count"},
		},
		{
			name:       "invalid value is reported with the reason",
			setting:    fixture.Setting(types.SettingDefaultReplicaCount, "lots", v1beta1.SettingStatus{Applied: true}),
			wantStatus: v1beta1.SettingStatus{Message: `setting default-replica-count: value "lots" is not an integer`},
			wantWrites: []string{"update settings/status default-replica-count"},
			wantEvents: []string{"Warning InvalidSetting"},
		},
		{
			name:       "unknown setting is reported",
			setting:    fixture.Setting("no-such-thing", "1", v1beta1.SettingStatus{}),
			wantStatus: v1beta1.SettingStatus{Message: `unknown setting "no-such-thing"`},
			wantWrites: []string{"update settings/status no-such-thing"},
			wantEvents: []string{"Warning InvalidSetting"},
		},
		{
			name:       "unchanged verdict writes nothing",
			setting:    fixture.Setting(types.SettingDisableSnapshotPurge, "true", v1beta1.SettingStatus{Applied: true}),
			wantStatus: v1beta1.SettingStatus{Applied: true},
		},
		{
			name:       "a manager that is not alive leaves it to the others",
			setting:    fixture.Setting(types.SettingDefaultReplicaCount, "2", v1beta1.SettingStatus{}),
			aliveNodes: []runtime.Object{},
			wantStatus: v1beta1.SettingStatus{},
		},
		{
			name:       "write failure is returned for retry",
			setting:    fixture.Setting(types.SettingDefaultReplicaCount, "2", v1beta1.SettingStatus{}),
			apiErr:     &fixture.ReactorError{Verb: "update", Resource: "settings", Subresource: "status", Err: errors.New("conflict-ish")},
			wantErr:    "conflict-ish",
			wantStatus: v1beta1.SettingStatus{},
			wantWrites: []string{"update settings/status default-replica-count"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := alive
			if tc.aliveNodes != nil {
				nodes = tc.aliveNodes
			}
			env := dstest.New(t, append([]runtime.Object{tc.setting}, nodes...), []runtime.Object{fixture.Lease("node-1", 0)})
			if tc.apiErr != nil {
				tc.apiErr.Install(env.Strata)
			}
			rec := record.NewFakeRecorder(10)
			sc, err := NewSettingController(logrus.New(), env.DS, rec, "node-1")
			require.NoError(t, err)
			env.ClearActions()

			err = sc.syncSetting(context.Background(), fixture.NS+"/"+tc.setting.Name)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()))
			fixture.AssertEvents(t, tc.wantEvents, rec)
			got, err := env.Strata.StrataV1beta1().Settings(fixture.NS).Get(context.Background(), tc.setting.Name, metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, tc.wantStatus, got.Status)
		})
	}
}

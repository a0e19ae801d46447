package instance

import (
	"context"
	"errors"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

func TestInstanceManagerControllerSync(t *testing.T) {
	const addr = "127.0.0.1:8500"
	running := v1beta1.InstanceManagerStatus{OwnerID: "node-1", Endpoint: addr, CurrentState: v1beta1.InstanceStateRunning,
		Conditions: []metav1.Condition{{Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionTrue,
			Reason: imConditionReasonWatching, Message: "the instance manager answers on its Watch stream",
			LastTransitionTime: metav1.NewTime(dstest.Now)}}}
	tests := []struct {
		name       string
		existing   []runtime.Object
		conn       imConnection
		apiErr     *fixture.ReactorError
		wantErr    string
		wantState  v1beta1.InstanceState
		wantReady  metav1.ConditionStatus
		wantWrites []string
		wantEvents []string
	}{
		{name: "missing CR is created", wantWrites: []string{"create instancemanagers im-node-1"}},
		{name: "open Watch stream means running", existing: []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{})},
			conn: imConnection{connected: true}, wantState: v1beta1.InstanceStateRunning, wantReady: metav1.ConditionTrue,
			wantWrites: []string{"update instancemanagers/status im-node-1"}, wantEvents: []string{"Normal Running"}},
		{name: "failed stream is an error with the reason", existing: []runtime.Object{fixture.IM(running)},
			conn: imConnection{err: "connection refused"}, wantState: v1beta1.InstanceStateError, wantReady: metav1.ConditionFalse,
			wantWrites: []string{"update instancemanagers/status im-node-1"}, wantEvents: []string{"Warning Unreachable"}},
		{name: "no stream yet is unknown", existing: []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{})},
			wantState: v1beta1.InstanceStateUnknown, wantReady: metav1.ConditionFalse,
			wantWrites: []string{"update instancemanagers/status im-node-1"}},
		{name: "unchanged state writes nothing", existing: []runtime.Object{fixture.IM(running)},
			conn: imConnection{connected: true}, wantState: v1beta1.InstanceStateRunning, wantReady: metav1.ConditionTrue},
		{name: "write failure is returned", existing: []runtime.Object{fixture.IM(v1beta1.InstanceManagerStatus{})},
			conn: imConnection{connected: true}, apiErr: &fixture.ReactorError{Verb: "update", Resource: "instancemanagers", Subresource: "status", Err: errors.New("boom")},
			wantErr: "boom", wantState: "", wantReady: "", wantWrites: []string{"update instancemanagers/status im-node-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, tc.existing, nil)
			if tc.apiErr != nil {
				tc.apiErr.Install(env.Strata)
			}
			rec := record.NewFakeRecorder(10)
			c, err := NewInstanceManagerController(logrus.New(), env.DS, rec, "node-1", addr, engineapi.NewPool(0, nil), kit.NewInstanceCache())
			require.NoError(t, err)
			c.conn = tc.conn
			env.ClearActions()

			err = c.syncInstanceManager(context.Background(), c.key())
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()))
			fixture.AssertEvents(t, tc.wantEvents, rec)
			im, err := env.Strata.StrataV1beta1().InstanceManagers(fixture.NS).Get(context.Background(), "im-node-1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, "node-1", im.Spec.NodeID)
			assert.Equal(t, tc.wantState, im.Status.CurrentState)
			if tc.wantReady != "" {
				assert.Equal(t, tc.wantReady, meta.FindStatusCondition(im.Status.Conditions, v1beta1.ConditionTypeReady).Status)
			}
		})
	}
}

package controller

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
)

// reactorError makes the fake Strata clientset fail one kind of call, the
// way external-snapshotter's tests inject API errors.
type ReactorError struct {
	Verb, Resource, Subresource string
	Err                         error
}

func (r ReactorError) Install(fake interface {
	PrependReactor(verb, resource string, reaction k8stesting.ReactionFunc)
}) {
	fake.PrependReactor(r.Verb, r.Resource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != r.Subresource {
			return false, nil, nil
		}
		return true, nil, r.Err
	})
}

// writes lists the fake client's mutating calls as "verb resource[/sub] name".
func Writes(actions []k8stesting.Action) []string {
	var out []string
	for _, a := range actions {
		switch a.GetVerb() {
		case "get", "list", "watch":
			continue
		}
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		name := ""
		switch act := a.(type) {
		case k8stesting.CreateAction:
			if m, ok := act.GetObject().(interface{ GetName() string }); ok {
				name = m.GetName()
			}
		case k8stesting.UpdateAction:
			if m, ok := act.GetObject().(interface{ GetName() string }); ok {
				name = m.GetName()
			}
		case k8stesting.DeleteAction:
			name = act.GetName()
		}
		out = append(out, fmt.Sprintf("%s %s %s", a.GetVerb(), res, name))
	}
	return out
}

// drainEvents returns the recorded events as "Type Reason" so tables stay short.
func DrainEvents(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			f := strings.Fields(e)
			if len(f) >= 2 {
				out = append(out, f[0]+" "+f[1])
			}
		default:
			return out
		}
	}
}

func AssertEvents(t *testing.T, want []string, rec *record.FakeRecorder) {
	t.Helper()
	got := DrainEvents(rec)
	if len(want) == 0 {
		assert.Empty(t, got, "events")
		return
	}
	assert.Equal(t, want, got, "events")
}

// syncCase is one row of a controller table, as external-snapshotter's
// framework_test.go runs them: the objects the fake API server starts with,
// an API error to inject, data-plane errors to inject, and what must come
// out — the error, the API writes, the data-plane calls, the events.
type SyncCase struct {
	Name    string
	Objects []runtime.Object // Strata objects
	Kube    []runtime.Object // Kubernetes objects; default: live leases of node-1..3
	Me      string           // this manager's node; default node-1
	Key     string           // queue key; default testNS/v1
	APIErr  *ReactorError
	DPErr   map[string]error // data-plane method -> error
	WantErr string
	// wantWrites lists "verb resource[/sub] name" of the Strata API writes.
	WantWrites []string
	// wantCalls lists the data-plane calls ("Method arg ..."); nil: none.
	WantCalls  []string
	WantEvents []string
	Check      func(t *testing.T, env *dstest.Env)
}

// syncFunc builds the controller under test over env and returns its sync.
type SyncFunc func(env *dstest.Env, rec record.EventRecorder, me string, dp engineapi.Connector) (func(context.Context, string) error, error)

// runSyncCases runs each case against a fresh fake API server and data plane.
func RunSyncCases(t *testing.T, cases []SyncCase, build SyncFunc) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			kube := tc.Kube
			if kube == nil {
				kube = []runtime.Object{Lease("node-1", 0), Lease("node-2", 0), Lease("node-3", 0)}
			}
			env := dstest.New(t, tc.Objects, kube)
			if tc.APIErr != nil {
				tc.APIErr.Install(env.Strata)
			}
			me := cmp.Or(tc.Me, "node-1")
			dp := NewFakeConnector(tc.DPErr)
			rec := record.NewFakeRecorder(20)
			sync, err := build(env, rec, me, dp)
			require.NoError(t, err)
			env.ClearActions()

			err = sync(context.Background(), cmp.Or(tc.Key, NS+"/v1"))
			if tc.WantErr != "" {
				require.ErrorContains(t, err, tc.WantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.WantWrites, trimGeneratedNames(Writes(env.Strata.Actions())), "API writes")
			assert.Equal(t, tc.WantCalls, dp.Calls(), "data-plane calls")
			AssertEvents(t, tc.WantEvents, rec)
			if tc.Check != nil {
				tc.Check(t, env)
			}
		})
	}
}

// allChecks runs several checks of a case in order.
func AllChecks(checks ...func(*testing.T, *dstest.Env)) func(*testing.T, *dstest.Env) {
	return func(t *testing.T, env *dstest.Env) {
		for _, c := range checks {
			c(t, env)
		}
	}
}

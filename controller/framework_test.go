package controller

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

// reactorError makes the fake Strata clientset fail one kind of call, the
// way external-snapshotter's tests inject API errors.
type reactorError struct {
	verb, resource, subresource string
	err                         error
}

func (r reactorError) install(fake interface {
	PrependReactor(verb, resource string, reaction k8stesting.ReactionFunc)
}) {
	fake.PrependReactor(r.verb, r.resource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != r.subresource {
			return false, nil, nil
		}
		return true, nil, r.err
	})
}

// writes lists the fake client's mutating calls as "verb resource[/sub] name".
func writes(actions []k8stesting.Action) []string {
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
func drainEvents(rec *record.FakeRecorder) []string {
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

func assertEvents(t *testing.T, want []string, rec *record.FakeRecorder) {
	t.Helper()
	got := drainEvents(rec)
	if len(want) == 0 {
		assert.Empty(t, got, "events")
		return
	}
	assert.Equal(t, want, got, "events")
}

package controller

import (
	"context"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/setting"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func TestRequeueOnNodeReadyChange(t *testing.T) {
	env := dstest.New(t, []runtime.Object{
		fixture.Node("node-2", nil, fixture.ReadyTrue()),
		fixture.Setting(types.SettingDefaultReplicaCount, "3", v1beta1.SettingStatus{}),
		fixture.Setting(types.SettingBackupTarget, "", v1beta1.SettingStatus{}),
	}, nil)
	sc, err := setting.NewSettingController(logrus.New(), env.DS, record.NewFakeRecorder(10), "node-1")
	require.NoError(t, err)
	drain := func() int {
		n := 0
		for sc.Queue.Len() > 0 {
			key, _ := sc.Queue.Get()
			sc.Queue.Done(key)
			n++
		}
		return n
	}
	require.Eventually(t, func() bool { return sc.Queue.Len() == 2 }, 5*time.Second, 10*time.Millisecond, "initial adds")
	drain()

	nodes := env.Strata.StrataV1beta1().Nodes(fixture.NS)
	ctx := context.Background()
	// Updates that keep Ready enqueue nothing: TestReadyFlipped proves
	// that on the filter itself rather than by waiting for no event.
	steps := []struct {
		name   string
		mutate func(*v1beta1.Node)
	}{
		{"Ready flipping to False enqueues every setting", func(n *v1beta1.Node) {
			n.Status.Conditions = []metav1.Condition{fixture.ReadyDown("gone")}
		}},
		{"Ready flipping back enqueues every setting", func(n *v1beta1.Node) {
			n.Status.Conditions = []metav1.Condition{fixture.ReadyTrue()}
		}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			n, err := nodes.Get(ctx, "node-2", metav1.GetOptions{})
			require.NoError(t, err)
			step.mutate(n)
			updated, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				c, _ := env.DS.Nodes.GetRO("node-2")
				return c.ResourceVersion == updated.ResourceVersion
			}, 5*time.Second, 10*time.Millisecond)
			require.Eventually(t, func() bool { return sc.Queue.Len() == 2 }, 5*time.Second, 10*time.Millisecond)
			assert.Equal(t, 2, drain())
		})
	}
}

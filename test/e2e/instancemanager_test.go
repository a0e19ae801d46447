package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

func imState(t *testing.T, node string) (v1beta1.InstanceState, *v1beta1.InstanceManager) {
	t.Helper()
	im, err := env.adminStrata.StrataV1beta1().InstanceManagers(types.DefaultNamespace).Get(
		context.Background(), "im-"+node, metav1.GetOptions{})
	if err != nil {
		return "", nil
	}
	return im.Status.CurrentState, im
}

// Each node's manager keeps an InstanceManager CR for its node's data plane,
// from a Watch stream it holds open: killing the instance manager turns the
// CR to error with the reason, restarting it brings it back to running.
func TestInstanceManagerCRFollowsTheDataPlane(t *testing.T) {
	for _, n := range nodeNames {
		require.Eventually(t, func() bool { s, _ := imState(t, n); return s == v1beta1.InstanceStateRunning },
			time.Minute, 100*time.Millisecond, "im-%s running", n)
		_, im := imState(t, n)
		assert.Equal(t, env.managers[n].IM.GRPCAddr, im.Status.Endpoint)
		assert.Equal(t, n, im.Spec.NodeID)
		assert.Equal(t, n, im.Status.OwnerID)
		assert.True(t, meta.IsStatusConditionTrue(im.Status.Conditions, v1beta1.ConditionTypeReady))
	}

	const victim = "node-2"
	mgr := env.managers[victim]
	require.NoError(t, mgr.IM.Kill())
	require.Eventually(t, func() bool { s, _ := imState(t, victim); return s == v1beta1.InstanceStateError },
		30*time.Second, 100*time.Millisecond, "a dead instance manager is reported")
	_, im := imState(t, victim)
	c := meta.FindStatusCondition(im.Status.Conditions, v1beta1.ConditionTypeReady)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Contains(t, c.Message, "Watch stream to "+mgr.IM.GRPCAddr+" failed")

	restarted, err := localcluster.StartInstanceManager(env.managerOpts, victim, mgr.IM)
	require.NoError(t, err)
	mgr.IM = restarted
	require.Eventually(t, func() bool { s, _ := imState(t, victim); return s == v1beta1.InstanceStateRunning },
		30*time.Second, 100*time.Millisecond, "the manager reconnects to the restarted instance manager")
}

package snapshot

// Per-volume snapshot limits (issue 14): the SnapshotLimit condition, the
// engine controller's setting of the limits on a running engine, and the
// snapshot controller's part (a refusal said clearly; system snapshots
// taken as such).

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// TestSnapshotControllerLimits: a refusal by the volume's limits is said in
// status.error and an event, naming the limit with its figures; the
// snapshots Strata takes for a clone or an export are taken as system
// snapshots, which the limits never refuse.
func TestSnapshotControllerLimits(t *testing.T) {
	im := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Spec:   v1beta1.InstanceManagerSpec{NodeID: "node-1"},
		Status: v1beta1.InstanceManagerStatus{CurrentState: v1beta1.InstanceStateRunning, Endpoint: "im-node-1:8500"}}
	limited := func(maxCount int32, maxSize int64, snaps map[string]*v1beta1.SnapshotInfo) *v1beta1.Engine {
		return fixture.Engine(fixture.EngineRunningOn("node-1", fixture.AllRW()), func(e *v1beta1.Engine) {
			e.Spec.SnapshotMaxCount, e.Spec.SnapshotMaxSize, e.Status.Snapshots = maxCount, maxSize, snaps
		})
	}
	refused := fmt.Errorf("snapshot s1 refused by replica r1: snapshot limit exceeded: 2 user snapshots, at most 2 allowed: %w",
		engineapi.ErrLimitExceeded)
	statusError := func(want string) func(*testing.T, *dstest.Env) {
		return func(t *testing.T, env *dstest.Env) {
			s, err := env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(context.Background(), "s1", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, want, s.Status.Error)
			assert.False(t, s.Status.ReadyToUse)
		}
	}
	ownedBy := func(kind, name string) func(*v1beta1.Snapshot) {
		return func(s *v1beta1.Snapshot) {
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: kind, Name: name, UID: "uid-x"}}
		}
	}
	runSnapshotCases(t, []fixture.SyncCase{
		{
			Name:       "over the count limit: the status names the field and the figures",
			Objects:    []runtime.Object{im, fixture.Volume(fixture.AttachedOn("node-1")), limited(2, 0, fixture.LimitedChain(2)), fixture.VA(), fixture.Snapshot("s1", true)},
			DPErr:      map[string]error{"SnapshotCreate": refused},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 true"},
			WantWrites: []string{"update snapshots/status s1"},
			WantEvents: []string{"Warning SnapshotFailed"},
			Check: statusError("snapshot limit exceeded: volume v1 holds 2 of at most 2 user snapshots (spec.snapshotMaxCount); " +
				"delete snapshots or raise the limit (engine: " + refused.Error() + ")"),
		},
		{
			Name:       "over the size limit: its figures",
			Objects:    []runtime.Object{im, fixture.Volume(fixture.AttachedOn("node-1")), limited(250, 3*fixture.MiB, fixture.LimitedChain(1)), fixture.VA(), fixture.Snapshot("s1", true)},
			DPErr:      map[string]error{"SnapshotCreate": refused},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 true"},
			WantWrites: []string{"update snapshots/status s1"},
			WantEvents: []string{"Warning SnapshotFailed"},
			Check: statusError("snapshot limit exceeded: volume v1's snapshots hold 3145728 of at most 3145728 bytes (spec.snapshotMaxSize); " +
				"delete snapshots or raise the limit (engine: " + refused.Error() + ")"),
		},
		{
			Name:       "refused before the cached chain shows why: both limits",
			Objects:    []runtime.Object{im, fixture.Volume(fixture.AttachedOn("node-1")), limited(2, 0, fixture.LimitedChain(1)), fixture.VA(), fixture.Snapshot("s1", true)},
			DPErr:      map[string]error{"SnapshotCreate": refused},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 true"},
			WantWrites: []string{"update snapshots/status s1"},
			WantEvents: []string{"Warning SnapshotFailed"},
			Check: statusError("snapshot limit exceeded: volume v1 allows at most 2 user snapshots (spec.snapshotMaxCount) and 0 bytes " +
				"of snapshots (spec.snapshotMaxSize, 0: no limit); delete snapshots or raise the limit (engine: " + refused.Error() + ")"),
		},
		{
			Name: "a vol:// clone's snapshot (owned by the target volume): a system snapshot",
			Objects: []runtime.Object{im, fixture.Volume(fixture.AttachedOn("node-1")), limited(2, 0, fixture.LimitedChain(2)), fixture.VA(),
				fixture.Snapshot("s1", true, ownedBy("Volume", "clone-target"))},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 false"},
			WantEvents: []string{"Normal SnapshotCreated"},
		},
		{
			Name: "a backing image export's snapshot: a system snapshot",
			Objects: []runtime.Object{im, fixture.Volume(fixture.AttachedOn("node-1")), limited(2, 0, fixture.LimitedChain(2)), fixture.VA(),
				fixture.Snapshot("s1", true, ownedBy("BackingImage", "bi"))},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 false"},
			WantEvents: []string{"Normal SnapshotCreated"},
		},
		{
			Name: "a user's snapshot owned by its own volume (as the webhook makes it): a user snapshot",
			Objects: []runtime.Object{im, fixture.Volume(fixture.AttachedOn("node-1")), limited(5, 0, fixture.LimitedChain(2)), fixture.VA(),
				fixture.Snapshot("s1", true, ownedBy("Volume", "v1"))},
			WantCalls:  []string{"SnapshotCreate v1-e-0 s1 true"},
			WantEvents: []string{"Normal SnapshotCreated"},
		},
	})
}

package instance

import (
	"context"
	"fmt"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
)

// syncedCache is an instance cache whose stream replayed insts and synced,
// as the InstanceManager controller leaves it.
func syncedCache(insts ...*engineapi.Instance) *kit.InstanceCache {
	c := kit.NewInstanceCache()
	c.StreamOpened()
	for _, inst := range insts {
		c.Apply(&engineapi.WatchEvent{Kind: engineapi.WatchUpdated, Instance: inst})
	}
	c.Apply(&engineapi.WatchEvent{Kind: engineapi.WatchSynced})
	return c
}

// TestEngineSnapshotLimits: the engine controller sets the spec's limits on
// the running engine only when they differ from what status.snapshotLimits
// says it was given, again after a replica joins, and records them when
// the instance is created with them.
func TestEngineSnapshotLimits(t *testing.T) {
	running := &engineapi.Instance{Name: "v1-e-0", Type: engineapi.InstanceTypeEngine, VolumeName: "v1", Size: fixture.GiB,
		State: engineapi.InstanceStateRunning, FrontendEndpoint: "nbd://127.0.0.1:10809/v1",
		ReplicaModes: map[string]engineapi.ReplicaMode{"r1": engineapi.ReplicaModeRW, "r2": engineapi.ReplicaModeRW}}
	limits := func(count int32, size int64) *v1beta1.EngineSnapshotLimits {
		return &v1beta1.EngineSnapshotLimits{MaxCount: count, MaxSize: size}
	}
	// engine runs on node-1 with r1 and r2, its status as the monitor
	// writes it from the instance, spec and record of limits as given.
	engine := func(spec v1beta1.EngineSnapshotLimits, recorded *v1beta1.EngineSnapshotLimits, mut ...func(*v1beta1.Engine)) *v1beta1.Engine {
		e := fixture.Engine(func(e *v1beta1.Engine) {
			e.Spec.NodeID, e.Spec.DesireState = "node-1", v1beta1.InstanceStateRunning
			e.Spec.ReplicaAddressMap = map[string]string{"r1": "10.0.0.1:9001", "r2": "10.0.0.2:9001"}
			e.Spec.SnapshotMaxCount, e.Spec.SnapshotMaxSize = spec.MaxCount, spec.MaxSize
			e.Status.OwnerID = "node-1"
			e.Status.CurrentReplicaAddressMap = map[string]string{"r1": "10.0.0.1:9001", "r2": "10.0.0.2:9001"}
		})
		observeEngine(e, running, true, true, kit.InstanceManagerName("node-1"))
		e.Status.SnapshotLimits = recorded
		for _, m := range mut {
			m(e)
		}
		return e
	}
	recorded := func(want *v1beta1.EngineSnapshotLimits) func(*testing.T, *v1beta1.Engine) {
		return func(t *testing.T, e *v1beta1.Engine) { assert.Equal(t, want, e.Status.SnapshotLimits) }
	}
	tests := []struct {
		name       string
		engine     *v1beta1.Engine
		instances  []*engineapi.Instance
		dpErr      map[string]error
		wantErr    string
		wantCalls  []string
		wantWrites []string
		wantEvents []string
		check      func(*testing.T, *v1beta1.Engine)
	}{
		{name: "as recorded: no call, no write",
			engine: engine(*limits(2, 0), limits(2, 0)), instances: []*engineapi.Instance{running},
			check: recorded(limits(2, 0))},
		{name: "no record (an engine from before the record, or after a replica joined): set, recorded, no event",
			engine: engine(*limits(2, 0), nil), instances: []*engineapi.Instance{running},
			wantCalls: []string{"SnapshotLimitsSet v1-e-0 2 0"}, wantWrites: []string{"update engines/status v1-e-0"},
			check: recorded(limits(2, 0))},
		{name: "the volume's count changed while it runs: set, recorded, an event",
			engine: engine(*limits(5, 0), limits(2, 0)), instances: []*engineapi.Instance{running},
			wantCalls: []string{"SnapshotLimitsSet v1-e-0 5 0"}, wantWrites: []string{"update engines/status v1-e-0"},
			wantEvents: []string{"Normal SnapshotLimitsSet"}, check: recorded(limits(5, 0))},
		{name: "the volume's size limit changed: set",
			engine: engine(*limits(2, 4*fixture.GiB), limits(2, 0)), instances: []*engineapi.Instance{running},
			wantCalls: []string{"SnapshotLimitsSet v1-e-0 2 4294967296"}, wantWrites: []string{"update engines/status v1-e-0"},
			wantEvents: []string{"Normal SnapshotLimitsSet"}, check: recorded(limits(2, 4*fixture.GiB))},
		{name: "a replica joins: it is rebuilt, and the limits are set again (a new replica has none)",
			engine:    engine(*limits(2, 0), limits(2, 0), func(e *v1beta1.Engine) { e.Spec.ReplicaAddressMap["r3"] = "10.0.0.3:9001" }),
			instances: []*engineapi.Instance{running},
			// The record is back as it was: nothing to write (r3 shows in
			// the status with the instance's next event).
			wantCalls:  []string{"ReplicaAdd v1-e-0 r3 10.0.0.3:9001 true", "SnapshotLimitsSet v1-e-0 2 0"},
			wantEvents: []string{"Normal ReplicaAdded"}, check: recorded(limits(2, 0))},
		{name: "setting them fails: the error is returned, the old record kept for a retry",
			engine: engine(*limits(5, 0), limits(2, 0)), instances: []*engineapi.Instance{running},
			dpErr:     map[string]error{"SnapshotLimitsSet": fmt.Errorf("replica r2: %w", engineapi.ErrUnavailable)},
			wantErr:   "setting snapshot limits (5 snapshots, 0 bytes) on engine v1-e-0: replica r2",
			wantCalls: []string{"SnapshotLimitsSet v1-e-0 5 0"}, check: recorded(limits(2, 0))},
		{name: "not running yet: created with the spec's limits, which are recorded",
			engine:    engine(*limits(2, 0), nil),
			wantCalls: []string{"InstanceCreate v1-e-0"}, wantWrites: []string{"update engines/status v1-e-0"},
			check: recorded(limits(2, 0))},
		{name: "asked to stop: the record goes with the instance",
			engine: engine(*limits(2, 0), limits(2, 0), func(e *v1beta1.Engine) {
				e.Spec.DesireState = v1beta1.InstanceStateStopped
			}),
			instances: []*engineapi.Instance{running},
			wantCalls: []string{"InstanceDelete v1-e-0"}, wantWrites: []string{"update engines/status v1-e-0"},
			check: recorded(nil)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := dstest.New(t, []runtime.Object{tc.engine, fixture.SchedNode("node-1")}, []runtime.Object{fixture.Lease("node-1", 0)})
			dp := fixture.NewFakeConnector(tc.dpErr)
			rec := record.NewFakeRecorder(20)
			c, err := NewEngineController(logrus.New(), env.DS, rec, "node-1", "im-node-1:8500", dp, syncedCache(tc.instances...))
			require.NoError(t, err)
			env.ClearActions()
			err = c.syncEngine(context.Background(), fixture.NS+"/v1-e-0")
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.wantCalls, dp.Calls(), "data-plane calls")
			assert.Equal(t, tc.wantWrites, fixture.Writes(env.Strata.Actions()), "API writes")
			fixture.AssertEvents(t, tc.wantEvents, rec)
			got, err := env.Strata.StrataV1beta1().Engines(fixture.NS).Get(context.Background(), "v1-e-0", metav1.GetOptions{})
			require.NoError(t, err)
			tc.check(t, got)
		})
	}
}

// TestEnginePurgesFreeableRemovedSnapshots: a removed snapshot the engine
// reports holding 16 MiB or more that a purge frees (the head overwrote or
// trimmed its blocks after its delete) gets a purge; less, a running
// purge, or purge disabled: none.
func TestEnginePurgesFreeableRemovedSnapshots(t *testing.T) {
	withRemoved := func(exclusive int64, purging bool) *engineapi.Instance {
		return &engineapi.Instance{Name: "v1-e-0", Type: engineapi.InstanceTypeEngine, VolumeName: "v1", Size: fixture.GiB,
			State: engineapi.InstanceStateRunning, FrontendEndpoint: "nbd://127.0.0.1:10809/v1",
			ReplicaModes: map[string]engineapi.ReplicaMode{"r1": engineapi.ReplicaModeRW},
			Snapshots: map[string]*engineapi.Snapshot{
				"s1":          {Name: "s1", Removed: true, Size: 64 << 20, Exclusive: exclusive, Children: []string{"volume-head"}},
				"volume-head": {Name: "volume-head", Parent: "s1"},
			},
			PurgeStatus: map[string]*engineapi.PurgeStatus{"r1": {IsPurging: purging}}}
	}
	noPurge := &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: "disable-snapshot-purge", Namespace: fixture.NS}, Value: "true"}
	tests := []struct {
		name      string
		inst      *engineapi.Instance
		objects   []runtime.Object
		wantCalls []string
	}{
		{"64 MiB freeable: purged", withRemoved(64<<20, false), nil, []string{"SnapshotPurge v1-e-0"}},
		{"under 16 MiB: left for the next delete", withRemoved(8<<20, false), nil, nil},
		{"a purge runs: none more", withRemoved(64<<20, true), nil, nil},
		{"purge disabled: none", withRemoved(64<<20, false), []runtime.Object{noPurge}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := fixture.Engine(func(e *v1beta1.Engine) {
				e.Spec.NodeID, e.Spec.DesireState = "node-1", v1beta1.InstanceStateRunning
				e.Spec.ReplicaAddressMap = map[string]string{"r1": "10.0.0.1:9001"}
				e.Status.OwnerID = "node-1"
				e.Status.CurrentReplicaAddressMap = map[string]string{"r1": "10.0.0.1:9001"}
			})
			observeEngine(e, tc.inst, true, true, kit.InstanceManagerName("node-1"))
			e.Status.SnapshotLimits = &v1beta1.EngineSnapshotLimits{}
			env := dstest.New(t, append([]runtime.Object{e, fixture.SchedNode("node-1")}, tc.objects...), []runtime.Object{fixture.Lease("node-1", 0)})
			dp := fixture.NewFakeConnector(nil)
			c, err := NewEngineController(logrus.New(), env.DS, record.NewFakeRecorder(20), "node-1", "im-node-1:8500", dp, syncedCache(tc.inst))
			require.NoError(t, err)
			require.NoError(t, c.syncEngine(context.Background(), fixture.NS+"/v1-e-0"))
			assert.Equal(t, tc.wantCalls, dp.Calls(), "data-plane calls")
		})
	}
}

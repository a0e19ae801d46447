package controller

import (
	"context"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/strata-storage/strata/controller/fixture"
	"github.com/strata-storage/strata/controller/instance"
	"github.com/strata-storage/strata/controller/kit"
	"github.com/strata-storage/strata/controller/kit/kittest"
	snapshotctl "github.com/strata-storage/strata/controller/snapshot"
	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// faultInjector is a gRPC interceptor in front of the real instance
// manager: it counts every unary call by method and fails the one method it
// is armed with until it is cleared, the way a busy engine or a failing
// replica would.
type faultInjector struct {
	mu     sync.Mutex
	calls  map[string]int
	method string
	err    error
}

func (f *faultInjector) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	method := path.Base(info.FullMethod)
	f.mu.Lock()
	f.calls[method]++
	var err error
	if method == f.method {
		err = f.err
	}
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (f *faultInjector) arm(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.method, f.err = method, err
	f.calls[method] = 0
}

func (f *faultInjector) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// snapshotRig runs the engine and snapshot controllers, as the manager does,
// over fake clientsets and a real in-process instance manager: volume v1 is
// attached on node-1, its engine v1-e-0 runs there with replicas r1 and r2.
type snapshotRig struct {
	t      *testing.T
	ctx    context.Context
	client *engineapi.Client
	env    *dstest.Env
	rec    *record.FakeRecorder
	logs   *logtest.Hook
	faults *faultInjector
}

const rigEngine = "v1-e-0"

func startSnapshotRig(t *testing.T) *snapshotRig {
	t.Helper()
	faults := &faultInjector{calls: map[string]int{}}
	// Purges are followed by the size reporter: a short interval publishes
	// their end promptly.
	im := kittest.StartRealIMWith(t, kittest.RealIMOptions{SizeReportInterval: 20 * time.Millisecond,
		ServerOptions: []grpc.ServerOption{grpc.UnaryInterceptor(faults.intercept)}})
	client, err := im.Pool.Get(im.Addr)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	disk := t.TempDir()
	addrs := im.StartReplicas(t, disk, "r1", "r2")
	vol := fixture.Volume(func(v *v1beta1.Volume) {
		v.Spec.NodeID, v.Spec.NumberOfReplicas = "node-1", 2
		v.Status.State, v.Status.CurrentNodeID, v.Status.CurrentSize = v1beta1.VolumeStateAttached, "node-1", 4<<20
	})
	eng := &v1beta1.Engine{
		ObjectMeta: metav1.ObjectMeta{Name: rigEngine, Namespace: fixture.NS, Finalizers: []string{types.FinalizerName},
			Labels: map[string]string{types.LabelVolume: "v1"}},
		Spec: v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1", VolumeSize: 4 << 20, NodeID: "node-1",
			DesireState: v1beta1.InstanceStateRunning}, ReplicaAddressMap: addrs},
	}
	imCR := &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
		Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: im.Addr}}
	env := dstest.New(t, []runtime.Object{fixture.SchedNode("node-1"), vol, eng, imCR, fixture.VA()},
		[]runtime.Object{fixture.Lease("node-1", 0)})

	logger := logrus.New()
	logger.SetOutput(io.Discard)
	logs := logtest.NewLocal(logger)
	rec := record.NewFakeRecorder(1000)
	ec, err := instance.NewEngineController(logger, env.DS, rec, "node-1", im.Addr, im.Pool, im.Instances())
	require.NoError(t, err)
	sc, err := snapshotctl.NewSnapshotController(logger, env.DS, rec, "node-1", im.Pool)
	require.NoError(t, err)
	go ec.Run(ctx, 1)
	go sc.Run(ctx, 1)

	r := &snapshotRig{t: t, ctx: ctx, client: client, env: env, rec: rec, logs: logs, faults: faults}
	r.eventually("the engine runs with both replicas", func() (bool, string) {
		e, err := env.DS.Engines.GetRO(rigEngine)
		if err != nil {
			return false, err.Error()
		}
		return kit.EngineRunning(e) && len(e.Status.ReplicaModeMap) == 2, fmt.Sprintf("status %+v", e.Status.InstanceStatus)
	})
	return r
}

// eventually waits for cond, an event the controllers must bring about; the
// deadline is only there to end a broken run.
func (r *snapshotRig) eventually(what string, cond func() (bool, string)) {
	r.t.Helper()
	var last string
	ok := assert.Eventually(r.t, func() bool {
		var done bool
		done, last = cond()
		return done
	}, 30*time.Second, 10*time.Millisecond)
	require.True(r.t, ok, "waiting for %s; last seen: %s", what, last)
}

// chain is the engine's snapshot chain as the instance manager reads it
// from the replicas now: name → marked removed, without the head.
func (r *snapshotRig) chain() map[string]bool {
	r.t.Helper()
	snaps, err := r.client.SnapshotList(r.ctx, rigEngine)
	require.NoError(r.t, err)
	out := map[string]bool{}
	for name, s := range snaps {
		if name != types.VolumeHeadName {
			out[name] = s.GetRemoved()
		}
	}
	return out
}

func (r *snapshotRig) snapshot(name string) *v1beta1.Snapshot {
	r.t.Helper()
	s, err := r.env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(r.ctx, name, metav1.GetOptions{})
	require.NoError(r.t, err)
	return s
}

// request creates a user snapshot CR, as kubectl would.
func (r *snapshotRig) request(name string) {
	r.t.Helper()
	_, err := r.env.Strata.StrataV1beta1().Snapshots(fixture.NS).Create(r.ctx, fixture.Snapshot(name, true, func(s *v1beta1.Snapshot) {
		s.UID = k8stypes.UID("uid-" + name)
		s.Status = v1beta1.SnapshotStatus{}
		s.Spec.Labels = map[string]string{"app": "db"}
	}), metav1.CreateOptions{})
	require.NoError(r.t, err)
}

// waitReady waits until the CR says the snapshot is taken.
func (r *snapshotRig) waitReady(name string) {
	r.t.Helper()
	r.eventually("snapshot "+name+" ready to use", func() (bool, string) {
		s := r.snapshot(name)
		return s.Status.ReadyToUse, fmt.Sprintf("status %+v", s.Status)
	})
}

// delete marks the CR deleted. The fake clientset would delete it at once
// despite the finalizer; the API server sets a deletion timestamp instead.
func (r *snapshotRig) delete(name string) {
	r.t.Helper()
	s := r.snapshot(name)
	now := metav1.NewTime(time.Now())
	s.DeletionTimestamp = &now
	_, err := r.env.Strata.StrataV1beta1().Snapshots(fixture.NS).Update(r.ctx, s, metav1.UpdateOptions{})
	require.NoError(r.t, err)
}

func (r *snapshotRig) released(name string) (bool, string) {
	s := r.snapshot(name)
	return !slices.Contains(s.Finalizers, types.FinalizerName), fmt.Sprintf("finalizers %v, chain %v", s.Finalizers, r.chain())
}

// purgedEverywhere: every replica reports a finished purge.
func (r *snapshotRig) purgedEverywhere() (bool, string) {
	st, err := r.client.SnapshotPurgeStatus(r.ctx, rigEngine)
	if err != nil {
		return false, err.Error()
	}
	done := len(st) == 2
	var seen []string
	for name, p := range st {
		done = done && !p.GetIsPurging() && p.GetState() == "complete"
		seen = append(seen, fmt.Sprintf("%s=%s/%s", name, p.GetState(), p.GetError()))
	}
	return done, strings.Join(seen, " ")
}

// loggedRetry tells whether a sync returned an error containing msg: the
// controller loop logs each failed sync before queueing its retry.
func (r *snapshotRig) loggedRetry(msg string) bool {
	for _, e := range r.logs.AllEntries() {
		if err, ok := e.Data[logrus.ErrorKey].(error); ok && e.Message == "Sync failed, will retry" &&
			strings.Contains(err.Error(), msg) {
			return true
		}
	}
	return false
}

// TestSnapshotControllerActionsAgainstRealInstanceManager takes, removes and
// purges snapshots through the engine and snapshot controllers and checks
// the outcome in the instance manager's own chain. A faulty call fails until
// the fault is cleared: the sync must return the error, be retried, and
// neither skip the step nor let the snapshot go meanwhile.
func TestSnapshotControllerActionsAgainstRealInstanceManager(t *testing.T) {
	busy := status.Error(codes.Aborted, "engine v1-e-0: replica r2 is being rebuilt: busy")
	tests := []struct {
		name     string
		existing []string // taken through CRs first, oldest first
		create   string   // a snapshot requested by the step
		remove   string   // a snapshot deleted by the step

		faultMethod string // instance-manager call failing until cleared
		faultErr    error
		wantLog     string          // the sync's error while it fails
		wantDuring  map[string]bool // the chain while it fails

		wantChain  map[string]bool // the chain at the end: name → marked removed
		wantEvents []string        // among the events of the step
	}{
		{
			name:       "requested on an attached volume: the engine takes it",
			create:     "s1",
			wantChain:  map[string]bool{"s1": false},
			wantEvents: []string{"Normal SnapshotCreated"},
		},
		{
			name:   "requested while the engine is busy: the error is returned and the take retried",
			create: "s1", faultMethod: "SnapshotCreate", faultErr: busy,
			wantLog:    "taking snapshot s1: engine v1-e-0: replica r2 is being rebuilt: busy",
			wantDuring: map[string]bool{},
			wantChain:  map[string]bool{"s1": false},
			wantEvents: []string{"Normal SnapshotCreated"},
		},
		{
			name:     "deleted under a newer snapshot: removed, and the purge coalesces it out of the chain",
			existing: []string{"s1", "s2"}, remove: "s1",
			wantChain:  map[string]bool{"s2": false},
			wantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			name:     "deleted under the head, holding nothing the volume reads: removed, then dropped by the purge",
			existing: []string{"s1"}, remove: "s1",
			wantChain:  map[string]bool{},
			wantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			name:     "the purge fails: the error is returned, the purge retried, the snapshot kept until it is gone",
			existing: []string{"s1", "s2"}, remove: "s1",
			faultMethod: "SnapshotPurge", faultErr: status.Error(codes.Internal, "purge: replica r2: no space left on device"),
			wantLog:    "purging volume v1: purge: replica r2: no space left on device",
			wantDuring: map[string]bool{"s1": true, "s2": false},
			wantChain:  map[string]bool{"s2": false},
			wantEvents: []string{"Normal SnapshotRemoved"},
		},
		{
			name:     "the engine is busy for the removal: the error is returned and the removal retried",
			existing: []string{"s1", "s2"}, remove: "s1",
			faultMethod: "SnapshotRemove", faultErr: busy,
			wantLog:    "removing snapshot s1: engine v1-e-0: replica r2 is being rebuilt: busy",
			wantDuring: map[string]bool{"s1": false, "s2": false},
			wantChain:  map[string]bool{"s2": false},
			wantEvents: []string{"Normal SnapshotRemoved"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := startSnapshotRig(t)
			for _, name := range tc.existing {
				r.request(name)
				r.waitReady(name)
			}
			fixture.DrainEvents(r.rec)
			if tc.faultMethod != "" {
				r.faults.arm(tc.faultMethod, tc.faultErr)
			}

			switch {
			case tc.create != "":
				r.request(tc.create)
			case tc.remove != "":
				r.delete(tc.remove)
			}

			if tc.faultMethod != "" {
				// Three failed calls: the first sync and two retries.
				r.eventually(tc.faultMethod+" retried", func() (bool, string) {
					n := r.faults.count(tc.faultMethod)
					return n >= 3, fmt.Sprintf("%d calls", n)
				})
				assert.True(t, r.loggedRetry(tc.wantLog), "a failed sync logged with %q", tc.wantLog)
				assert.Equal(t, tc.wantDuring, r.chain(), "the chain while %s fails", tc.faultMethod)
				if tc.remove != "" {
					assert.Contains(t, r.snapshot(tc.remove).Finalizers, types.FinalizerName,
						"the snapshot is kept while its removal is unfinished")
				} else {
					assert.False(t, r.snapshot(tc.create).Status.ReadyToUse)
				}
				r.faults.arm("", nil)
			}

			if tc.create != "" {
				r.waitReady(tc.create)
				s := r.snapshot(tc.create)
				assert.True(t, s.Status.UserCreated)
				assert.NotEmpty(t, s.Status.CreationTime)
				assert.Equal(t, map[string]string{"app": "db"}, s.Status.Labels, "the engine got the spec's labels")
				assert.Empty(t, s.Status.Error)
			}
			if tc.remove != "" {
				r.eventually("snapshot "+tc.remove+" released", func() (bool, string) { return r.released(tc.remove) })
				r.eventually("a finished purge on every replica", r.purgedEverywhere)
			}
			// The purge is followed asynchronously: wait for the chain it
			// leaves rather than compare once.
			r.eventually("the chain after the step", func() (bool, string) {
				got := r.chain()
				return assert.ObjectsAreEqual(tc.wantChain, got), fmt.Sprintf("%v", got)
			})
			events := fixture.DrainEvents(r.rec)
			for _, e := range tc.wantEvents {
				assert.Contains(t, events, e)
			}
		})
	}
}

// TestSnapshotLimitsAgainstRealInstanceManager runs the engine and snapshot
// controllers over a real instance manager: the count limit refuses the
// next user snapshot with a clear error, system snapshots (a clone's, an
// export's, a rebuild's) are still taken, replicas rebuilt into the engine
// enforce the limit too, and a raised limit applies to the running engine.
func TestSnapshotLimitsAgainstRealInstanceManager(t *testing.T) {
	r := startSnapshotRig(t)
	setLimit := func(n int32) {
		t.Helper()
		e, err := r.env.Strata.StrataV1beta1().Engines(fixture.NS).Get(r.ctx, rigEngine, metav1.GetOptions{})
		require.NoError(t, err)
		e.Spec.SnapshotMaxCount = n
		_, err = r.env.Strata.StrataV1beta1().Engines(fixture.NS).Update(r.ctx, e, metav1.UpdateOptions{})
		require.NoError(t, err)
		r.eventually(fmt.Sprintf("the engine given %d", n), func() (bool, string) {
			e, err := r.env.DS.Engines.GetRO(rigEngine)
			if err != nil {
				return false, err.Error()
			}
			return e.Status.SnapshotLimits != nil && e.Status.SnapshotLimits.MaxCount == n, fmt.Sprintf("%+v", e.Status.SnapshotLimits)
		})
	}
	refusal := func(name string) (bool, string) {
		s := r.snapshot(name)
		return strings.HasPrefix(s.Status.Error, v1beta1.SnapshotLimitExceeded), fmt.Sprintf("status %+v", s.Status)
	}
	setLimit(2)
	r.request("s1")
	r.request("s2")
	r.waitReady("s1")
	r.waitReady("s2")
	fixture.DrainEvents(r.rec)

	r.request("s3")
	r.eventually("s3 refused", func() (bool, string) { return refusal("s3") })
	s3 := r.snapshot("s3")
	assert.Contains(t, s3.Status.Error, "volume v1 holds 2 of at most 2 user snapshots (spec.snapshotMaxCount)")
	assert.Contains(t, s3.Status.Error, "2 user snapshots, at most 2 allowed", "the engine's own words")
	assert.False(t, s3.Status.ReadyToUse)
	assert.Contains(t, fixture.DrainEvents(r.rec), "Warning SnapshotFailed")
	assert.NotContains(t, r.chain(), "s3")

	// A clone's and an export's snapshots are the system's: not refused.
	for name, owner := range map[string]metav1.OwnerReference{
		"clone-src":  {APIVersion: "strata.io/v1beta1", Kind: "Volume", Name: "v2", UID: "uid-v2"},
		"export-src": {APIVersion: "strata.io/v1beta1", Kind: "BackingImage", Name: "bi", UID: "uid-bi"},
	} {
		_, err := r.env.Strata.StrataV1beta1().Snapshots(fixture.NS).Create(r.ctx, fixture.Snapshot(name, true, func(s *v1beta1.Snapshot) {
			s.OwnerReferences, s.Status = []metav1.OwnerReference{owner}, v1beta1.SnapshotStatus{}
		}), metav1.CreateOptions{})
		require.NoError(t, err)
		r.waitReady(name)
		assert.False(t, r.snapshot(name).Status.UserCreated, "%s is a system snapshot", name)
	}

	// Rebuild r3 into the engine, then drop r1 and r2: only rebuilt
	// replicas are left, and they must refuse too.
	dp := r.client.DataPlane()
	inst, err := dp.InstanceCreate(r.ctx, engineapi.InstanceSpec{Name: "r3", Type: engineapi.InstanceTypeReplica,
		VolumeName: "v1", Size: 4 << 20, DataDir: filepath.Join(t.TempDir(), "r3")})
	require.NoError(t, err)
	editReplicas := func(edit func(map[string]string)) {
		t.Helper()
		e, err := r.env.Strata.StrataV1beta1().Engines(fixture.NS).Get(r.ctx, rigEngine, metav1.GetOptions{})
		require.NoError(t, err)
		edit(e.Spec.ReplicaAddressMap)
		_, err = r.env.Strata.StrataV1beta1().Engines(fixture.NS).Update(r.ctx, e, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	modes := func(want map[string]v1beta1.ReplicaMode) func() (bool, string) {
		return func() (bool, string) {
			e, err := r.env.DS.Engines.GetRO(rigEngine)
			if err != nil {
				return false, err.Error()
			}
			return assert.ObjectsAreEqual(want, e.Status.ReplicaModeMap), fmt.Sprintf("%v", e.Status.ReplicaModeMap)
		}
	}
	editReplicas(func(m map[string]string) { m["r3"] = inst.Address })
	r.eventually("r3 rebuilt", modes(map[string]v1beta1.ReplicaMode{"r1": "RW", "r2": "RW", "r3": "RW"}))
	editReplicas(func(m map[string]string) { delete(m, "r1"); delete(m, "r2") })
	r.eventually("only r3 left", modes(map[string]v1beta1.ReplicaMode{"r3": "RW"}))
	system := 0
	for name, s := range mustList(t, r) {
		if strings.HasPrefix(name, "rebuild-") && !s.UserCreated {
			system++
		}
	}
	assert.Equal(t, 1, system, "the rebuild took a system snapshot on the volume at its limit")
	r.request("s4")
	r.eventually("s4 refused by the rebuilt replica", func() (bool, string) { return refusal("s4") })

	// Raised while it runs: the next snapshot is taken.
	setLimit(5)
	assert.Contains(t, fixture.DrainEvents(r.rec), "Normal SnapshotLimitsSet")
	r.request("s5")
	r.waitReady("s5")
}

// mustList is the engine's chain as the instance manager reads it now.
func mustList(t *testing.T, r *snapshotRig) map[string]*engineapi.Snapshot {
	t.Helper()
	snaps, err := r.client.DataPlane().SnapshotList(r.ctx, rigEngine)
	require.NoError(t, err)
	return snaps
}

package controller

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// groupRig runs the engine, snapshot and group snapshot controllers over
// fake clientsets and a real in-process instance manager: volumes v1 and
// v2 are attached on node-1, each with an engine of one replica.
type groupRig struct {
	*snapshotRig
}

func startGroupRig(t *testing.T) *groupRig {
	t.Helper()
	im := kittest.StartRealIMWith(t, kittest.RealIMOptions{SizeReportInterval: 20 * time.Millisecond})
	client, err := im.Pool.Get(im.Addr)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dp, err := im.Pool.DataPlane(im.Addr)
	require.NoError(t, err)

	disk := t.TempDir()
	objects := []runtime.Object{fixture.SchedNode("node-1"),
		&v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: fixture.NS},
			Status: v1beta1.InstanceManagerStatus{OwnerID: "node-1", CurrentState: v1beta1.InstanceStateRunning, Endpoint: im.Addr}}}
	for _, vol := range []string{"v1", "v2"} {
		inst, err := dp.InstanceCreate(ctx, engineapi.InstanceSpec{Name: vol + "-r1", Type: engineapi.InstanceTypeReplica,
			VolumeName: vol, Size: 4 << 20, DataDir: filepath.Join(disk, vol+"-r1")})
		require.NoError(t, err)
		objects = append(objects, fixture.Volume(func(v *v1beta1.Volume) {
			v.Name, v.UID = vol, k8stypes.UID("uid-"+vol)
			v.Spec.NodeID, v.Spec.NumberOfReplicas = "node-1", 1
			v.Status.State, v.Status.CurrentNodeID, v.Status.CurrentSize = v1beta1.VolumeStateAttached, "node-1", 4<<20
		}), &v1beta1.Engine{
			ObjectMeta: metav1.ObjectMeta{Name: vol + "-e-0", Namespace: fixture.NS, Finalizers: []string{types.FinalizerName},
				Labels: map[string]string{types.LabelVolume: vol}},
			Spec: v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: vol, VolumeSize: 4 << 20, NodeID: "node-1",
				DesireState: v1beta1.InstanceStateRunning}, ReplicaAddressMap: map[string]string{vol + "-r1": inst.Address}},
		}, &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: vol, Namespace: fixture.NS},
			Spec: v1beta1.VolumeAttachmentSpec{Volume: vol, AttachmentTickets: map[string]*v1beta1.AttachmentTicket{}}})
	}
	env := dstest.New(t, objects, []runtime.Object{fixture.Lease("node-1", 0)})
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	rec := record.NewFakeRecorder(1000)
	ec, err := instance.NewEngineController(logger, env.DS, rec, "node-1", im.Addr, im.Pool, im.Instances())
	require.NoError(t, err)
	sc, err := snapshotctl.NewSnapshotController(logger, env.DS, rec, "node-1", im.Pool)
	require.NoError(t, err)
	gc, err := snapshotctl.NewSnapshotGroupController(logger, env.DS, rec, "node-1", im.Pool)
	require.NoError(t, err)
	go ec.Run(ctx, 1)
	go sc.Run(ctx, 1)
	go gc.Run(ctx, 1)

	r := &groupRig{&snapshotRig{t: t, ctx: ctx, client: client, env: env, rec: rec}}
	for _, vol := range []string{"v1", "v2"} {
		r.eventually("engine of "+vol+" runs", func() (bool, string) {
			e, err := env.DS.Engines.GetRO(vol + "-e-0")
			if err != nil {
				return false, err.Error()
			}
			return kit.EngineRunning(e) && e.Status.Snapshots != nil, fmt.Sprintf("status %+v", e.Status.InstanceStatus)
		})
	}
	return r
}

func (r *groupRig) createGroup(g *v1beta1.SnapshotGroup) {
	r.t.Helper()
	g.Namespace = fixture.NS
	if g.UID == "" {
		g.UID = k8stypes.UID("uid-" + g.Name)
	}
	_, err := r.env.Strata.StrataV1beta1().SnapshotGroups(fixture.NS).Create(r.ctx, g, metav1.CreateOptions{})
	require.NoError(r.t, err)
}

func (r *groupRig) group(name string) *v1beta1.SnapshotGroup {
	r.t.Helper()
	g, err := r.env.Strata.StrataV1beta1().SnapshotGroups(fixture.NS).Get(r.ctx, name, metav1.GetOptions{})
	require.NoError(r.t, err)
	return g
}

func (r *groupRig) waitState(name string, state v1beta1.SnapshotGroupState) *v1beta1.SnapshotGroup {
	r.t.Helper()
	var g *v1beta1.SnapshotGroup
	r.eventually("group "+name+" "+string(state), func() (bool, string) {
		g = r.group(name)
		return g.Status.State == state, fmt.Sprintf("status %+v", g.Status)
	})
	return g
}

// engineChain is the chain of a volume's engine as the replicas hold it:
// snapshot name → removed.
func (r *groupRig) engineChain(vol string) map[string]bool {
	r.t.Helper()
	snaps, err := r.client.SnapshotList(r.ctx, vol+"-e-0")
	require.NoError(r.t, err)
	out := map[string]bool{}
	for name, s := range snaps {
		if name != types.VolumeHeadName {
			out[name] = s.GetRemoved()
		}
	}
	return out
}

func TestSnapshotGroupControllerAgainstRealInstanceManager(t *testing.T) {
	r := startGroupRig(t)

	t.Run("a group of two attached volumes is cut, and each member gets its labelled CR", func(t *testing.T) {
		r.createGroup(&v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: "db"},
			Spec: v1beta1.SnapshotGroupSpec{Volumes: []string{"v1", "v2"}, Labels: map[string]string{"app": "db"}}})
		g := r.waitState("db", v1beta1.SnapshotGroupReady)
		assert.True(t, g.Status.ReadyToUse)
		assert.Equal(t, int32(1), g.Status.Attempt)
		assert.Equal(t, []v1beta1.SnapshotGroupMember{{Volume: "v1", Snapshot: "db-v1"}, {Volume: "v2", Snapshot: "db-v2"}}, g.Status.Snapshots)
		assert.NotEmpty(t, g.Status.CreationTime)
		for _, m := range g.Status.Snapshots {
			assert.Equal(t, map[string]bool{m.Snapshot: false}, r.engineChain(m.Volume), "the engine of %s holds its member", m.Volume)
			r.eventually("member "+m.Snapshot+" ready", func() (bool, string) {
				s, err := r.env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(r.ctx, m.Snapshot, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				return s.Status.ReadyToUse && s.Labels[types.LabelSnapshotGroup] == "db" && hasOwner(s.OwnerReferences, "uid-db"),
					fmt.Sprintf("labels %v owners %v status %+v", s.Labels, s.OwnerReferences, s.Status)
			})
			s := r.snapshot(m.Snapshot)
			assert.Equal(t, "db", s.Status.Labels[types.LabelSnapshotGroup], "the engine holds the group label")
			assert.Equal(t, "db", s.Status.Labels["app"])
			assert.True(t, s.Status.UserCreated)
		}
	})

	t.Run("a cut left half done by a dead manager is rolled back and taken again", func(t *testing.T) {
		// The dead manager's cut took v1's snapshot and recorded Cutting.
		_, err := r.client.SnapshotCreate(r.ctx, "v1-e-0", "half-v1", true, map[string]string{types.LabelSnapshotGroup: "half"}, 0)
		require.NoError(t, err)
		r.createGroup(&v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: "half"},
			Spec: v1beta1.SnapshotGroupSpec{Volumes: []string{"v1", "v2"}},
			Status: v1beta1.SnapshotGroupStatus{OwnerID: "node-1", State: v1beta1.SnapshotGroupCutting, Attempt: 1,
				Snapshots: []v1beta1.SnapshotGroupMember{{Volume: "v1", Snapshot: "half-v1"}, {Volume: "v2", Snapshot: "half-v2"}}}})
		g := r.waitState("half", v1beta1.SnapshotGroupReady)
		assert.Equal(t, int32(2), g.Status.Attempt)
		assert.Equal(t, []v1beta1.SnapshotGroupMember{{Volume: "v1", Snapshot: "half-v1-2"}, {Volume: "v2", Snapshot: "half-v2-2"}}, g.Status.Snapshots)
		assert.True(t, r.engineChain("v1")["half-v1"], "the half cut's snapshot is removed")
		require.Eventually(t, func() bool {
			s, err := r.env.Strata.StrataV1beta1().Snapshots(fixture.NS).Get(r.ctx, "half-v1", metav1.GetOptions{})
			return apierrors.IsNotFound(err) || (err == nil && s.DeletionTimestamp != nil)
		}, 10*time.Second, 10*time.Millisecond, "the half cut's Snapshot CR is deleted with it")
		assert.False(t, r.engineChain("v1")["half-v1-2"])
		assert.False(t, r.engineChain("v2")["half-v2-2"])
	})

	t.Run("a group naming a volume that does not exist fails, taking nothing", func(t *testing.T) {
		before := r.engineChain("v1")
		r.createGroup(&v1beta1.SnapshotGroup{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
			Spec: v1beta1.SnapshotGroupSpec{Volumes: []string{"v1", "nope"}}})
		g := r.waitState("bad", v1beta1.SnapshotGroupFailed)
		assert.Contains(t, g.Status.Error, "volume nope does not exist")
		assert.False(t, g.Status.ReadyToUse)
		assert.Equal(t, before, r.engineChain("v1"))
	})
}

func hasOwner(refs []metav1.OwnerReference, uid k8stypes.UID) bool {
	for _, r := range refs {
		if r.UID == uid {
			return true
		}
	}
	return false
}

package csi

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const gib = int64(1) << 30

// testDisk is one disk of a capacityNode, in GiB; the disk is named dN by
// its position and its UUID is <node>-dN.
type testDisk struct {
	max, available, scheduled, reserved int64
	off                                 bool // spec.allowScheduling false
}

// capacityNode is a Ready node that allows scheduling, with the given disks.
func capacityNode(name string, disks ...testDisk) *v1beta1.Node {
	n := strataNode(name)
	n.Spec.AllowScheduling = true
	n.Spec.Disks = map[string]v1beta1.DiskSpec{}
	n.Status.DiskStatus = map[string]*v1beta1.DiskStatus{}
	n.Status.Conditions = []metav1.Condition{{Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionTrue}}
	for i, d := range disks {
		disk := fmt.Sprintf("d%d", i)
		n.Spec.Disks[disk] = v1beta1.DiskSpec{Path: "/data/" + disk, AllowScheduling: !d.off,
			StorageReserved: *resource.NewQuantity(d.reserved*gib, resource.BinarySI)}
		n.Status.DiskStatus[disk] = &v1beta1.DiskStatus{DiskUUID: name + "-" + disk,
			StorageMaximum: d.max * gib, StorageAvailable: d.available * gib, StorageScheduled: d.scheduled * gib}
	}
	return n
}

func withNode(n *v1beta1.Node, edit func(*v1beta1.Node)) *v1beta1.Node { edit(n); return n }

// heartbeat is a node manager's live lease.
func heartbeat(node string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: types.NodeLeaseName(node), Namespace: types.DefaultNamespace,
			Labels: map[string]string{types.LabelComponent: types.ComponentNodeLease, types.LabelNode: node}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(10)),
			RenewTime: &metav1.MicroTime{Time: dstest.Now}},
	}
}

func TestGetCapacity(t *testing.T) {
	// node-1 can take 70 + 50 GiB (100 GiB usable with 30 scheduled; 50 free
	// of 50), node-2 100 GiB; the settings have their defaults (100%
	// over-provisioning, 25% minimal available).
	cluster := []runtime.Object{
		capacityNode("node-1", testDisk{max: 100, available: 80, scheduled: 30}, testDisk{max: 50, available: 50}),
		capacityNode("node-2", testDisk{max: 100, available: 100}),
	}
	tests := []struct {
		name     string
		extra    []runtime.Object
		down     []string // nodes without a heartbeat
		node     string   // the topology's node; "": no topology
		params   map[string]string
		caps     []*csi.VolumeCapability
		wantCode codes.Code
		wantMsg  string
		// wantAvailable and wantMax are in GiB
		wantAvailable, wantMax int64
	}{
		{name: "one node: the sum of its disks, the largest disk", node: "node-1", wantAvailable: 120, wantMax: 70},
		{name: "no topology: every node", wantAvailable: 220, wantMax: 100},
		{name: "unknown node", node: "node-9"},
		{name: "scheduling off on the node", node: "node-3",
			extra: []runtime.Object{withNode(capacityNode("node-3", testDisk{max: 100, available: 100}), func(n *v1beta1.Node) { n.Spec.AllowScheduling = false })}},
		{name: "node not Ready", node: "node-3",
			extra: []runtime.Object{withNode(capacityNode("node-3", testDisk{max: 100, available: 100}), func(n *v1beta1.Node) {
				n.Status.Conditions[0].Status = metav1.ConditionFalse
			})}},
		{name: "node without heartbeat", node: "node-2", down: []string{"node-2"}},
		{name: "unschedulable nodes add nothing to the total", down: []string{"node-1"}, wantAvailable: 100, wantMax: 100},
		{name: "disk below the minimal available percentage; disk with scheduling off", node: "node-3",
			extra: []runtime.Object{capacityNode("node-3", testDisk{max: 100, available: 20}, testDisk{max: 100, available: 100, off: true},
				testDisk{max: 100, available: 100, reserved: 80})}},
		{name: "disk the node controller found unschedulable", node: "node-3",
			extra: []runtime.Object{withNode(capacityNode("node-3", testDisk{max: 100, available: 100}), func(n *v1beta1.Node) {
				n.Status.DiskStatus["d0"].Conditions = []metav1.Condition{{Type: v1beta1.ConditionTypeSchedulable, Status: metav1.ConditionFalse}}
			})}},
		{name: "reserved space and over-provisioning", node: "node-3",
			extra: []runtime.Object{capacityNode("node-3", testDisk{max: 100, available: 90, reserved: 10}),
				&v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingStorageOverProvisioningPercentage),
					Namespace: types.DefaultNamespace}, Value: "200"}},
			wantAvailable: 180, wantMax: 180},
		{name: "replicas the disk status has not counted yet", node: "node-2",
			extra: []runtime.Object{&v1beta1.Replica{ObjectMeta: metav1.ObjectMeta{Name: "r-1", Namespace: types.DefaultNamespace},
				Spec: v1beta1.ReplicaSpec{InstanceSpec: v1beta1.InstanceSpec{NodeID: "node-2", VolumeSize: 40 * gib}, DiskID: "node-2-d0"}}},
			wantAvailable: 60, wantMax: 60},
		{name: "CreateVolume's parameters", node: "node-2",
			params:        map[string]string{ParamNumberOfReplicas: "2", "csi.storage.k8s.io/pvc/name": "data"},
			wantAvailable: 100, wantMax: 100},
		{name: "unknown parameter", params: map[string]string{"staleReplicaTimeout": "30"},
			wantCode: codes.InvalidArgument, wantMsg: `parameter "staleReplicaTimeout": unknown`},
		{name: "bad replica count", params: map[string]string{ParamNumberOfReplicas: "0"},
			wantCode: codes.InvalidArgument, wantMsg: "numberOfReplicas=\"0\": must be a whole number from 1 to 20"},
		{name: "capabilities no volume has", node: "node-2",
			caps: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}},
		{name: "supported capabilities", node: "node-2", caps: []*csi.VolumeCapability{rwo}, wantAvailable: 100, wantMax: 100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objects := append(slices.Clone(cluster), tc.extra...)
			var leases []runtime.Object
			for _, o := range objects {
				if n, ok := o.(*v1beta1.Node); ok && !slices.Contains(tc.down, n.Name) {
					leases = append(leases, heartbeat(n.Name))
				}
			}
			d := infoDriver(t, objects, leases)
			req := &csi.GetCapacityRequest{Parameters: tc.params, VolumeCapabilities: tc.caps}
			if tc.node != "" {
				req.AccessibleTopology = &csi.Topology{Segments: map[string]string{TopologyNodeKey: tc.node}}
			}
			resp, err := d.GetCapacity(t.Context(), req)
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			assert.Equal(t, tc.wantAvailable*gib, resp.AvailableCapacity, "available_capacity")
			assert.Equal(t, tc.wantMax*gib, resp.GetMaximumVolumeSize().GetValue(), "maximum_volume_size")
			assert.Equal(t, int64(4096), resp.GetMinimumVolumeSize().GetValue(), "minimum_volume_size")
		})
	}
}

func infoDriver(t *testing.T, strata, kube []runtime.Object) *Driver {
	t.Helper()
	d, _ := controllerDriver(t, strata, kube, nil)
	return d
}

func infoVolume(name string, edit ...func(*v1beta1.Volume)) *v1beta1.Volume {
	v := existingVolume(name, 1<<30, 2)
	v.Status.Robustness = v1beta1.VolumeRobustnessHealthy
	for _, e := range edit {
		e(v)
	}
	return v
}

func attachedTo(nodes ...string) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Status.State, v.Status.CurrentNodeID = v1beta1.VolumeStateAttached, nodes[0]
		if len(nodes) > 1 {
			v.Status.CurrentMigrationNodeID = nodes[1]
		}
	}
}

func deleting(v *v1beta1.Volume) {
	v.DeletionTimestamp, v.Finalizers = &metav1.Time{Time: dstest.Now}, []string{types.FinalizerName}
}

func degraded(robustness v1beta1.VolumeRobustness, why string) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Status.Robustness = robustness
		v.Status.Conditions = []metav1.Condition{{Type: "Salvaged", Status: metav1.ConditionTrue, Reason: "Salvaged"},
			{Type: "Scheduled", Status: metav1.ConditionFalse, Reason: "ReplicaUnschedulable", Message: why}}
	}
}

var infoVolumes = []runtime.Object{
	infoVolume("vol-e"), infoVolume("vol-a"), infoVolume("vol-b", attachedTo("node-1")),
	infoVolume("vol-c", attachedTo("node-1", "node-2")), infoVolume("vol-d", deleting),
}

// entryString is a ListVolumes entry as "volume:published nodes".
func entryString(id string, nodes []string) string { return id + ":" + strings.Join(nodes, ",") }

func TestListVolumes(t *testing.T) {
	tests := []struct {
		name        string
		max         int32
		token       string
		wantCode    codes.Code
		wantMsg     string
		wantEntries []string
		wantNext    string
	}{
		{name: "all, in name order, without the one being deleted",
			wantEntries: []string{"vol-a:", "vol-b:node-1", "vol-c:node-1,node-2", "vol-e:"}},
		{name: "first page", max: 2, wantEntries: []string{"vol-a:", "vol-b:node-1"}, wantNext: "after:vol-b"},
		{name: "last page", max: 2, token: "after:vol-b", wantEntries: []string{"vol-c:node-1,node-2", "vol-e:"}},
		{name: "after a volume gone since: the next name", max: 1, token: "after:vol-bb",
			wantEntries: []string{"vol-c:node-1,node-2"}, wantNext: "after:vol-c"},
		{name: "after the last volume: empty", token: "after:vol-e"},
		{name: "max_entries equal to what is left: no next token", max: 4, wantEntries: []string{"vol-a:", "vol-b:node-1", "vol-c:node-1,node-2", "vol-e:"}},
		{name: "a token this driver never gave", token: "invalid-token", wantCode: codes.Aborted, wantMsg: `starting_token "invalid-token"`},
		{name: "a token without a name", token: "after:", wantCode: codes.Aborted},
		{name: "negative max_entries", max: -1, wantCode: codes.InvalidArgument, wantMsg: "must not be negative"},
	}
	d := infoDriver(t, infoVolumes, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := d.ListVolumes(t.Context(), &csi.ListVolumesRequest{MaxEntries: tc.max, StartingToken: tc.token})
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			var got []string
			for _, e := range resp.Entries {
				got = append(got, entryString(e.Volume.VolumeId, e.Status.PublishedNodeIds))
				assert.Equal(t, int64(1<<30), e.Volume.CapacityBytes, "capacity of %s", e.Volume.VolumeId)
			}
			assert.Equal(t, tc.wantEntries, got)
			assert.Equal(t, tc.wantNext, resp.NextToken)
		})
	}

	t.Run("walking the pages lists every volume once", func(t *testing.T) {
		var names []string
		req := &csi.ListVolumesRequest{MaxEntries: 1}
		for range 10 {
			resp, err := d.ListVolumes(t.Context(), req)
			require.NoError(t, err)
			for _, e := range resp.Entries {
				names = append(names, e.Volume.VolumeId)
			}
			if req.StartingToken = resp.NextToken; req.StartingToken == "" {
				break
			}
		}
		assert.Equal(t, []string{"vol-a", "vol-b", "vol-c", "vol-e"}, names)
	})
}

func TestControllerGetVolume(t *testing.T) {
	tests := []struct {
		name      string
		id        string
		wantCode  codes.Code
		wantMsg   string
		wantEntry string
	}{
		{name: "attached", id: "vol-b", wantEntry: "vol-b:node-1"},
		{name: "migrating: both nodes", id: "vol-c", wantEntry: "vol-c:node-1,node-2"},
		{name: "detached", id: "vol-a", wantEntry: "vol-a:"},
		{name: "missing", id: "vol-x", wantCode: codes.NotFound, wantMsg: "volume vol-x"},
		{name: "being deleted", id: "vol-d", wantCode: codes.NotFound, wantMsg: "being deleted"},
		{name: "no id", wantCode: codes.InvalidArgument, wantMsg: "volume_id: required"},
	}
	d := infoDriver(t, infoVolumes, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := d.ControllerGetVolume(t.Context(), &csi.ControllerGetVolumeRequest{VolumeId: tc.id})
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			assert.Equal(t, tc.wantEntry, entryString(resp.Volume.VolumeId, resp.Status.PublishedNodeIds))
			assert.Equal(t, int64(1<<30), resp.Volume.CapacityBytes)
		})
	}
}

func TestVolumeHealth(t *testing.T) {
	volumes := []runtime.Object{
		infoVolume("vol-ok"), infoVolume("vol-new", func(v *v1beta1.Volume) { v.Status.Robustness = "" }),
		infoVolume("vol-deg", degraded(v1beta1.VolumeRobustnessDegraded, "no disk has 1 TiB free")),
		infoVolume("vol-flt", degraded(v1beta1.VolumeRobustnessFaulted, "no node is up")),
		infoVolume("vol-gone", deleting, degraded(v1beta1.VolumeRobustnessFaulted, "no node is up")),
	}
	tests := []struct {
		name     string
		id       string
		wantCode codes.Code
		wantMsg  string
		// want is the health entry as "STATUS Reason: message"; "": healthy
		want string
	}{
		{name: "healthy: no entry", id: "vol-ok"},
		{name: "robustness not known yet: no entry", id: "vol-new"},
		{name: "degraded, with the false condition", id: "vol-deg",
			want: "DEGRADED Degraded: volume is degraded: Scheduled is False (ReplicaUnschedulable): no disk has 1 TiB free"},
		{name: "faulted: inaccessible", id: "vol-flt",
			want: "INACCESSIBLE Faulted: volume is faulted: Scheduled is False (ReplicaUnschedulable): no node is up"},
		{name: "missing", id: "vol-x", wantCode: codes.NotFound},
		{name: "no id", wantCode: codes.InvalidArgument, wantMsg: "volume_id: required"},
	}
	d := infoDriver(t, volumes, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := d.ControllerGetVolumeHealth(t.Context(), &csi.ControllerGetVolumeHealthRequest{VolumeId: tc.id})
			if !wantResult(t, err, tc.wantCode, tc.wantMsg) {
				return
			}
			assert.Equal(t, tc.id, resp.VolumeHealth.VolumeId)
			assert.Equal(t, tc.want, healthString(resp.VolumeHealth))
		})
	}

	t.Run("the list holds the abnormal volumes only, paged", func(t *testing.T) {
		first, err := d.ControllerListVolumeHealth(t.Context(), &csi.ControllerListVolumeHealthRequest{MaxEntries: 1})
		require.NoError(t, err)
		require.Len(t, first.Entries, 1)
		assert.Equal(t, "vol-deg", first.Entries[0].VolumeId)
		rest, err := d.ControllerListVolumeHealth(t.Context(), &csi.ControllerListVolumeHealthRequest{StartingToken: first.NextToken})
		require.NoError(t, err)
		require.Len(t, rest.Entries, 1)
		assert.Equal(t, "vol-flt", rest.Entries[0].VolumeId)
		assert.Empty(t, rest.NextToken)
	})
}

func healthString(h *csi.VolumeHealth) string {
	var parts []string
	for _, s := range h.HealthStatuses {
		parts = append(parts, fmt.Sprintf("%s %s: %s", s.Status, s.Reason, s.Message))
	}
	return strings.Join(parts, "; ")
}

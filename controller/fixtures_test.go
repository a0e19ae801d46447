package controller

// Fixtures every controller table shares: the namespace, nodes and their
// heartbeats, volumes with their engines and replicas, snapshots and
// VolumeAttachments, each with options to change what a case needs.

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

const NS = types.DefaultNamespace

const GiB = int64(1) << 30

func Node(name string, disks map[string]string, conds ...metav1.Condition) *v1beta1.Node {
	n := &v1beta1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: NS},
		Spec:       v1beta1.NodeSpec{AllowScheduling: true, Disks: map[string]v1beta1.DiskSpec{}},
		Status:     v1beta1.NodeStatus{Conditions: conds},
	}
	for dn, p := range disks {
		n.Spec.Disks[dn] = v1beta1.DiskSpec{Path: p, AllowScheduling: true}
	}
	return n
}

func Lease(node string, renewedAgo time.Duration) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: types.NodeLeaseName(node), Namespace: NS,
			Labels: map[string]string{types.LabelComponent: types.ComponentNodeLease, types.LabelNode: node}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(10)),
			RenewTime: &metav1.MicroTime{Time: dstest.Now.Add(-renewedAgo)},
		},
	}
}

// Settings that make schedulability independent of the test machine's free space.
func ZeroMinAvailable() *v1beta1.Setting {
	return &v1beta1.Setting{
		ObjectMeta: metav1.ObjectMeta{Name: string(types.SettingStorageMinimalAvailablePercentage), Namespace: NS},
		Value:      "0",
	}
}

func ReadyDown(msg string) metav1.Condition {
	return metav1.Condition{Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionFalse,
		Reason: v1beta1.NodeConditionReasonManagerDown, Message: msg, LastTransitionTime: metav1.NewTime(dstest.Now)}
}

func ReadyTrue() metav1.Condition {
	return metav1.Condition{Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionTrue,
		Reason: v1beta1.NodeConditionReasonManagerRunning, Message: "x", LastTransitionTime: metav1.NewTime(dstest.Now)}
}

// schedNode is a Ready node with one schedulable 100 GiB disk.
func SchedNode(name string) *v1beta1.Node {
	n := Node(name, map[string]string{"disk-1": "/data/" + name}, ReadyTrue())
	n.Status.DiskStatus = map[string]*v1beta1.DiskStatus{"disk-1": {DiskUUID: "uuid-" + name,
		StorageMaximum: 100 * GiB, StorageAvailable: 100 * GiB}}
	return n
}

func Volume(mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
	v := &v1beta1.Volume{
		ObjectMeta: metav1.ObjectMeta{Name: "v1", Namespace: NS, UID: "uid-v1", Finalizers: []string{types.FinalizerName}},
		Spec:       v1beta1.VolumeSpec{Size: resource.MustParse("1Gi"), NumberOfReplicas: 3, Frontend: v1beta1.VolumeFrontendNBD},
		Status: v1beta1.VolumeStatus{OwnerID: "node-1", State: v1beta1.VolumeStateDetached, CurrentSize: GiB,
			Robustness: v1beta1.VolumeRobustnessHealthy},
	}
	for _, m := range mut {
		m(v)
	}
	return v
}

func Engine(mut ...func(*v1beta1.Engine)) *v1beta1.Engine {
	e := &v1beta1.Engine{
		ObjectMeta: metav1.ObjectMeta{Name: "v1-e-0", Namespace: NS, Finalizers: []string{types.FinalizerName}},
		Spec: v1beta1.EngineSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1", VolumeSize: GiB,
			DesireState: v1beta1.InstanceStateStopped}, Frontend: v1beta1.VolumeFrontendNBD},
		Status: v1beta1.EngineStatus{InstanceStatus: v1beta1.InstanceStatus{CurrentState: v1beta1.InstanceStateStopped}},
	}
	for _, m := range mut {
		m(e)
	}
	return e
}

func Replica(name, node string, mut ...func(*v1beta1.Replica)) *v1beta1.Replica {
	r := &v1beta1.Replica{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: NS, Finalizers: []string{types.FinalizerName},
			CreationTimestamp: metav1.NewTime(dstest.Now.Add(-time.Hour))},
		Spec: v1beta1.ReplicaSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1", VolumeSize: GiB, NodeID: node,
			DesireState: v1beta1.InstanceStateStopped}, EngineName: "v1-e-0", DiskID: "uuid-" + node,
			DiskPath: "/data/" + node, DataDirectoryName: name, HealthyAt: dstest.Now.Add(-time.Hour).Format(time.RFC3339)},
		Status: v1beta1.ReplicaStatus{InstanceStatus: v1beta1.InstanceStatus{CurrentState: v1beta1.InstanceStateStopped}},
	}
	for _, m := range mut {
		m(r)
	}
	return r
}

func ReplicaCR(name, disk string, mut ...func(*v1beta1.Replica)) *v1beta1.Replica {
	r := &v1beta1.Replica{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: NS, Finalizers: []string{types.FinalizerName}},
		Spec: v1beta1.ReplicaSpec{InstanceSpec: v1beta1.InstanceSpec{VolumeName: "v1", VolumeSize: 4 << 20, NodeID: "node-1",
			DesireState: v1beta1.InstanceStateRunning}, DiskPath: disk, DataDirectoryName: name},
	}
	for _, m := range mut {
		m(r)
	}
	return r
}

func Snapshot(name string, create bool, mut ...func(*v1beta1.Snapshot)) *v1beta1.Snapshot {
	s := &v1beta1.Snapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: NS, UID: "uid-" + "snap-" + "x",
			Labels: map[string]string{types.LabelVolume: "v1"}, Finalizers: []string{types.FinalizerName}},
		Spec:   v1beta1.SnapshotSpec{Volume: "v1", CreateSnapshot: create},
		Status: v1beta1.SnapshotStatus{OwnerID: "node-1"},
	}
	for _, m := range mut {
		m(s)
	}
	return s
}

func Deleting(s *v1beta1.Snapshot) { now := metav1.NewTime(dstest.Now); s.DeletionTimestamp = &now }

func VA(tickets ...*v1beta1.AttachmentTicket) *v1beta1.VolumeAttachment {
	va := &v1beta1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "v1", Namespace: NS},
		Spec: v1beta1.VolumeAttachmentSpec{Volume: "v1", AttachmentTickets: map[string]*v1beta1.AttachmentTicket{}}}
	for _, t := range tickets {
		va.Spec.AttachmentTickets[t.ID] = t
	}
	return va
}

func Ticket(id string, typ v1beta1.AttacherType, node string, params ...string) *v1beta1.AttachmentTicket {
	t := &v1beta1.AttachmentTicket{ID: id, Type: typ, NodeID: node, Parameters: map[string]string{}, Generation: 1}
	for i := 0; i+1 < len(params); i += 2 {
		t.Parameters[params[i]] = params[i+1]
	}
	return t
}

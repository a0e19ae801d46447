package controller

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/strata-storage/strata/datastore/dstest"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
)

// engineRunningOn makes the engine run on node with replicas r1..r3 in mode RW unless overridden.
func EngineRunningOn(node string, modes map[string]v1beta1.ReplicaMode) func(*v1beta1.Engine) {
	return func(e *v1beta1.Engine) {
		e.Spec.NodeID, e.Spec.DesireState = node, v1beta1.InstanceStateRunning
		e.Spec.ReplicaAddressMap = map[string]string{}
		for r := range modes {
			e.Spec.ReplicaAddressMap[r] = "10.0.0.1:9000"
		}
		e.Spec.SnapshotMaxCount = 250 // the setting's default
		e.Status.CurrentState = v1beta1.InstanceStateRunning
		e.Status.Endpoint = "nbd://127.0.0.1:10809/v1"
		e.Status.CurrentSize = GiB
		e.Status.ReplicaModeMap = modes
	}
}

func AttachedOn(node string) func(*v1beta1.Volume) {
	return func(v *v1beta1.Volume) {
		v.Spec.NodeID, v.Status.State, v.Status.CurrentNodeID, v.Status.OwnerID = node, v1beta1.VolumeStateAttached, node, node
		v.Status.FrontendEndpoint = "nbd://127.0.0.1:10809/v1"
		WithinSnapshotLimits(v)
	}
}

func ReplicaRunning(r *v1beta1.Replica) {
	r.Spec.DesireState = v1beta1.InstanceStateRunning
	r.Status.CurrentState, r.Status.IP, r.Status.Port = v1beta1.InstanceStateRunning, "10.0.0.1", 9000
}

func ThreeReplicas(mut ...func(*v1beta1.Replica)) []runtime.Object {
	return []runtime.Object{Replica("r1", "node-1", mut...), Replica("r2", "node-2", mut...), Replica("r3", "node-3", mut...)}
}

func AllRW() map[string]v1beta1.ReplicaMode {
	return map[string]v1beta1.ReplicaMode{"r1": v1beta1.ReplicaModeRW, "r2": v1beta1.ReplicaModeRW, "r3": v1beta1.ReplicaModeRW}
}

// trimGeneratedNames cuts the random suffix of created engines and replicas
// so the tables can name them.
func trimGeneratedNames(ws []string) []string {
	for i, w := range ws {
		for _, p := range []string{"v1-e-", "v1-r-"} {
			if j := indexOf(w, p); j >= 0 && len(w) == j+len(p)+8 {
				ws[i] = w[:j+len(p)]
			}
		}
	}
	return ws
}

// withNodes adds the schedulable nodes node-1 and node-2 to objects.
func WithNodes(objects ...runtime.Object) []runtime.Object {
	return append([]runtime.Object{SchedNode("node-1"), SchedNode("node-2")}, objects...)
}

func ReadySnap(name string) *v1beta1.Snapshot {
	return Snapshot(name, true, func(s *v1beta1.Snapshot) { s.Status.ReadyToUse = true })
}

// runningEngine is volume's engine on node-1, frontend off, replica r1 RW.
func RunningEngine(volume string) *v1beta1.Engine {
	return Engine(func(e *v1beta1.Engine) {
		e.Name, e.Spec.VolumeName, e.Spec.NodeID = volume+"-e-0", volume, "node-1"
		e.Spec.DesireState, e.Status.CurrentState = v1beta1.InstanceStateRunning, v1beta1.InstanceStateRunning
		e.Status.ReplicaModeMap = map[string]v1beta1.ReplicaMode{volume + "-r1": v1beta1.ReplicaModeRW}
		e.Status.CurrentReplicaAddressMap = map[string]string{volume + "-r1": "10.0.0.1:" + volume}
	})
}

func Tickets(ts ...*v1beta1.AttachmentTicket) map[string]*v1beta1.AttachmentTicket {
	m := map[string]*v1beta1.AttachmentTicket{}
	for _, t := range ts {
		m[t.ID] = t
	}
	return m
}

func Setting(name types.SettingName, value string, status v1beta1.SettingStatus) *v1beta1.Setting {
	return &v1beta1.Setting{ObjectMeta: metav1.ObjectMeta{Name: string(name), Namespace: NS}, Value: value, Status: status}
}

func IM(status v1beta1.InstanceManagerStatus) *v1beta1.InstanceManager {
	return &v1beta1.InstanceManager{ObjectMeta: metav1.ObjectMeta{Name: "im-node-1", Namespace: NS},
		Spec: v1beta1.InstanceManagerSpec{NodeID: "node-1"}, Status: status}
}

func Backup(name, snapshot string, mut ...func(*v1beta1.Backup)) *v1beta1.Backup {
	b := &v1beta1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: NS, UID: k8stypes.UID("uid-" + name),
		Finalizers: []string{types.FinalizerName}}, Spec: v1beta1.BackupSpec{SnapshotName: snapshot},
		Status: v1beta1.BackupStatus{OwnerID: "node-1"}}
	for _, m := range mut {
		m(b)
	}
	return b
}

func BackupState(state v1beta1.BackupState, progress int32) func(*v1beta1.Backup) {
	return func(b *v1beta1.Backup) {
		b.Status.State, b.Status.Progress, b.Status.VolumeName, b.Status.OwnerID = state, progress, "v1", "node-1"
	}
}

// testImage is backing image "img", owned by node-3 (a node with no disk
// here, so only the owner's decisions run), with copies wanted on the
// disks named, each in the state given.
func Image(copies map[string]v1beta1.BackingImageState, mut ...func(*v1beta1.BackingImage)) *v1beta1.BackingImage {
	bi := &v1beta1.BackingImage{
		ObjectMeta: metav1.ObjectMeta{Name: "img", Namespace: NS, UID: "uid-img", Finalizers: []string{types.FinalizerName}},
		Spec: v1beta1.BackingImageSpec{SourceType: v1beta1.BackingImageSourceTypeDownload,
			SourceParameters: map[string]string{v1beta1.BackingImageParameterURL: "http://images/img.qcow2"},
			DiskFileSpecMap:  map[string]*v1beta1.BackingImageDiskFileSpec{}},
		Status: v1beta1.BackingImageStatus{OwnerID: "node-3", UUID: "abcd1234", Checksum: "c",
			DiskFileStatusMap: map[string]*v1beta1.BackingImageDiskFileStatus{}, DiskLastRefAtMap: map[string]string{}},
	}
	for disk, state := range copies {
		bi.Spec.DiskFileSpecMap[disk] = &v1beta1.BackingImageDiskFileSpec{}
		bi.Status.DiskFileStatusMap[disk] = &v1beta1.BackingImageDiskFileStatus{State: state}
	}
	for _, m := range mut {
		m(bi)
	}
	return bi
}

// readyDiskNode is schedNode with its disk reported ready.
func ReadyDiskNode(name string) *v1beta1.Node {
	n := SchedNode(name)
	n.Status.DiskStatus["disk-1"].Conditions = []metav1.Condition{{Type: v1beta1.ConditionTypeReady, Status: metav1.ConditionTrue,
		Reason: v1beta1.DiskConditionReasonReady, LastTransitionTime: metav1.NewTime(dstest.Now)}}
	return n
}

// withinSnapshotLimits gives the volume the SnapshotLimit condition of an
// empty chain under the snapshot-max-count setting's default.
func WithinSnapshotLimits(v *v1beta1.Volume) {
	v.Status.Conditions = append(v.Status.Conditions, metav1.Condition{Type: v1beta1.VolumeConditionSnapshotLimit,
		Status: metav1.ConditionFalse, Reason: v1beta1.SnapshotLimitReasonWithin,
		Message: "under 250 user snapshots (spec.snapshotMaxCount); no size limit", LastTransitionTime: metav1.NewTime(dstest.Now)},
		metav1.Condition{Type: v1beta1.VolumeConditionSnapshotSpaceRetained, Status: metav1.ConditionFalse, Reason: "PurgeEnabled",
			Message: "deleted snapshots' data is freed by a purge", LastTransitionTime: metav1.NewTime(dstest.Now)})
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

const BadSumMsg = "downloading: checksum mismatch: spec.checksum is ab, the image's raw data has SHA-512 cd; " + "not retried until the image's spec changes; re-create the image with the right source or checksum"

// failedImage is img with its only copy, on node-1's disk, failed as a
// checksum mismatch leaves it.
func FailedImage() *v1beta1.BackingImage {
	return Image(map[string]v1beta1.BackingImageState{"uuid-node-1": v1beta1.BackingImageStateFailed},
		func(bi *v1beta1.BackingImage) {
			bi.Status.DiskFileStatusMap["uuid-node-1"].Message = BadSumMsg
			bi.Status.FirstCopyDisk = "uuid-node-1"
		})
}

// mkReplicaDirs creates <disk>/replicas/<name> for each name.
func MkReplicaDirs(t *testing.T, disk string, names ...string) {
	t.Helper()
	for _, n := range names {
		require.NoError(t, os.MkdirAll(filepath.Join(disk, "replicas", n), 0o755))
	}
}

// restoringVolume is v1, restored from backup b1, attached to node-1 with
// its frontend off.
func RestoringVolume(mut ...func(*v1beta1.Volume)) *v1beta1.Volume {
	return Volume(append([]func(*v1beta1.Volume){func(v *v1beta1.Volume) {
		v.Spec.FromBackup, v.Spec.DisableFrontend = "b1", true
		v.Spec.NodeID, v.Status.CurrentNodeID, v.Status.State = "node-1", "node-1", v1beta1.VolumeStateAttached
	}}, mut...)...)
}

// onImage puts the volume on backing image img.
func OnImage(v *v1beta1.Volume) { v.Spec.BackingImage = "img" }

// limitedChain is an engine chain of n user snapshots of 1 MiB, a removed
// one and a system (rebuild) one, which count for size only.
func LimitedChain(n int) map[string]*v1beta1.SnapshotInfo {
	m := Chain(SnapInfo("removed", func(i *v1beta1.SnapshotInfo) { i.Removed, i.Size = true, MiB }),
		SnapInfo("rebuild-1", func(i *v1beta1.SnapshotInfo) { i.UserCreated, i.Size = false, MiB }))
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("u%d", i)
		m[name] = SnapInfo(name, func(i *v1beta1.SnapshotInfo) { i.Size = MiB })
	}
	return m
}

const MiB = int64(1) << 20

func Chain(entries ...*v1beta1.SnapshotInfo) map[string]*v1beta1.SnapshotInfo {
	m := map[string]*v1beta1.SnapshotInfo{types.VolumeHeadName: {Name: types.VolumeHeadName, Size: 4096}}
	for _, e := range entries {
		m[e.Name] = e
	}
	return m
}

func SnapInfo(name string, mut ...func(*v1beta1.SnapshotInfo)) *v1beta1.SnapshotInfo {
	i := &v1beta1.SnapshotInfo{Name: name, UserCreated: true, Created: "2026-11-21T11:00:00Z", Size: 8192,
		Children: map[string]bool{types.VolumeHeadName: true}}
	for _, m := range mut {
		m(i)
	}
	return i
}

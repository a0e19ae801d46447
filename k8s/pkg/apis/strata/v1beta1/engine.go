package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/types"
)

// ReplicaMode is an engine's view of one of its replicas. One of "RW", "WO", "ERR".
// +kubebuilder:validation:Enum=RW;WO;ERR
type ReplicaMode string

const (
	// ReplicaModeRW serves reads and writes.
	ReplicaModeRW ReplicaMode = "RW"
	// ReplicaModeWO takes writes while it is rebuilt.
	ReplicaModeWO ReplicaMode = "WO"
	// ReplicaModeERR failed and takes no I/O.
	ReplicaModeERR ReplicaMode = "ERR"
)

// SnapshotInfo is the engine's record of one snapshot in the chain.
type SnapshotInfo struct {
	// Name of the snapshot; "volume-head" for the live head.
	Name string `json:"name"`
	// Parent is the snapshot this one was taken on top of.
	Parent string `json:"parent,omitempty"`
	// Children are the snapshots (and possibly the head) taken on top of this one.
	// +nullable
	Children map[string]bool `json:"children,omitempty"`
	// Removed is true once the snapshot is marked removed and awaits purge.
	Removed bool `json:"removed,omitempty"`
	// UserCreated is false for snapshots the system took (for a rebuild, say).
	UserCreated bool `json:"userCreated,omitempty"`
	// Created is the RFC 3339 time the snapshot was taken.
	Created string `json:"created,omitempty"`
	// Size is the allocated bytes of the snapshot's layer.
	Size int64 `json:"size,omitempty"`
	// +nullable
	Labels map[string]string `json:"labels,omitempty"`
	// Exclusive is the allocated bytes deleting the snapshot would free
	// now, given the chain (for a removed one, what the next purge frees).
	Exclusive int64 `json:"exclusive,omitempty"`
}

// PurgeStatus is the progress of a snapshot purge on one replica.
type PurgeStatus struct {
	IsPurging bool   `json:"isPurging,omitempty"`
	Progress  int32  `json:"progress,omitempty"`
	State     string `json:"state,omitempty"`
	Error     string `json:"error,omitempty"`
}

// RebuildStatus is the progress of rebuilding one replica.
type RebuildStatus struct {
	IsRebuilding bool   `json:"isRebuilding,omitempty"`
	Progress     int32  `json:"progress,omitempty"`
	State        string `json:"state,omitempty"`
	Error        string `json:"error,omitempty"`
	FromReplica  string `json:"fromReplica,omitempty"`
	// CopiedBytes is the layer data sent to the replica so far.
	CopiedBytes int64 `json:"copiedBytes,omitempty"`
	// KeptBytes is the data of the layers a returning replica already held
	// (same snapshot, same content) and kept instead of receiving them.
	KeptBytes    int64 `json:"keptBytes,omitempty"`
	CopiedLayers int32 `json:"copiedLayers,omitempty"`
	KeptLayers   int32 `json:"keptLayers,omitempty"`
}

// EngineCloneStatus is the progress of a snapshot clone filling the engine's volume.
type EngineCloneStatus struct {
	// Snapshot is the snapshot being copied.
	Snapshot string `json:"snapshot,omitempty"`
	// SourceAddress is the source replica's data address.
	SourceAddress string `json:"sourceAddress,omitempty"`
	// Progress is the percentage of the snapshot's data copied.
	Progress int32 `json:"progress,omitempty"`
}

// EngineSnapshotLimits are limits on a volume's user snapshots as set on a
// running engine; 0 is no limit.
type EngineSnapshotLimits struct {
	// MaxCount is the most user snapshots (not marked removed) the chain may hold.
	MaxCount int32 `json:"maxCount"`
	// MaxSize is the snapshot data, in bytes, beyond which no user snapshot is taken.
	MaxSize int64 `json:"maxSize"`
}

// EngineSpec is the desired state of a volume's engine.
type EngineSpec struct {
	InstanceSpec `json:",inline"`
	// Frontend is how the engine exposes the volume when it runs: "nbd", or ""
	// for none. One of "nbd", "".
	Frontend VolumeFrontend `json:"frontend,omitempty"`
	// DisableFrontend starts the engine without its frontend.
	DisableFrontend bool `json:"disableFrontend,omitempty"`
	// ReplicaAddressMap maps replica names to the data addresses the engine connects to.
	ReplicaAddressMap map[string]string `json:"replicaAddressMap,omitempty"`
	// SnapshotMaxCount caps user snapshots in the chain; 0 means no cap. At least 0.
	// +kubebuilder:validation:Minimum=0
	SnapshotMaxCount int32 `json:"snapshotMaxCount,omitempty"`
	// SnapshotMaxSize caps the total snapshot size in bytes; 0 means no cap. At least 0.
	// +kubebuilder:validation:Minimum=0
	SnapshotMaxSize int64 `json:"snapshotMaxSize,omitempty"`
}

// EngineStatus is the observed state of a volume's engine.
type EngineStatus struct {
	InstanceStatus `json:",inline"`
	// Endpoint is where the frontend serves the volume.
	Endpoint string `json:"endpoint,omitempty"`
	// CurrentSize is the volume size the engine runs with, in bytes.
	CurrentSize int64 `json:"currentSize,omitempty"`
	// CurrentReplicaAddressMap is the replica set the engine runs with.
	CurrentReplicaAddressMap map[string]string `json:"currentReplicaAddressMap,omitempty"`
	// ReplicaModeMap is the engine's view of each replica.
	ReplicaModeMap map[string]ReplicaMode `json:"replicaModeMap,omitempty"`
	// Snapshots is the engine's snapshot chain, keyed by snapshot name.
	// +nullable
	Snapshots map[string]*SnapshotInfo `json:"snapshots,omitempty"`
	// SnapshotsError is set when the chain could not be read.
	SnapshotsError string `json:"snapshotsError,omitempty"`
	// PurgeStatus is the purge progress per replica.
	// +nullable
	PurgeStatus map[string]*PurgeStatus `json:"purgeStatus,omitempty"`
	// RebuildStatus is the rebuild progress per replica being rebuilt.
	// +nullable
	RebuildStatus map[string]*RebuildStatus `json:"rebuildStatus,omitempty"`
	// CloneStatus is the snapshot clone filling the volume, while one runs.
	CloneStatus *EngineCloneStatus `json:"cloneStatus,omitempty"`
	// SnapshotLimits are the limits the engine controller last set on the
	// running engine and its replicas. The instance manager does not report
	// them, so this record is what tells a change of spec.snapshotMaxCount or
	// spec.snapshotMaxSize still to be applied. Unset: to be set again (a
	// replica joined, which starts with none).
	SnapshotLimits *EngineSnapshotLimits `json:"snapshotLimits,omitempty"`
}

// SnapshotUsage is what the chain holds against the volume's snapshot
// limits, counted as the data plane counts them (engine/replica
// checkLimits): the user snapshots not marked removed, and the bytes of
// every snapshot layer, removed and system ones included (they hold data
// until purged). The live head counts for neither.
func (st *EngineStatus) SnapshotUsage() (userCount int, size int64) {
	for name, s := range st.Snapshots {
		if s == nil || name == types.VolumeHeadName {
			continue
		}
		if s.UserCreated && !s.Removed {
			userCount++
		}
		size += s.Size
	}
	return userCount, size
}

// ActualSize is the allocated bytes of every layer of the chain, the head
// and removed snapshots included; ok is false while the engine has never
// reported its chain.
func (st *EngineStatus) ActualSize() (size int64, ok bool) {
	sp, ok := st.Space()
	return sp.Total(), ok
}

// ChainSpace splits a chain's allocated bytes: the head, snapshots, and
// removed snapshots.
type ChainSpace struct {
	Head, Snapshots, Removed int64
}

// Total is every layer's bytes.
func (sp ChainSpace) Total() int64 { return sp.Head + sp.Snapshots + sp.Removed }

// RemovedExclusive is what a purge would free from the chain's removed
// snapshots now, and their names.
func (st *EngineStatus) RemovedExclusive() (bytes int64, names []string) {
	for name, s := range st.Snapshots {
		if s != nil && s.Removed && s.Exclusive > 0 {
			bytes += s.Exclusive
			names = append(names, name)
		}
	}
	return bytes, names
}

// Space is the chain's allocated bytes by kind; ok is false while the
// engine has never reported its chain.
func (st *EngineStatus) Space() (sp ChainSpace, ok bool) {
	for name, s := range st.Snapshots {
		switch {
		case s == nil:
		case name == types.VolumeHeadName:
			sp.Head += s.Size
		case s.Removed:
			sp.Removed += s.Size
		default:
			sp.Snapshots += s.Size
		}
	}
	return sp, len(st.Snapshots) > 0
}

// Engine is the single writer of a volume: it fans writes out to the replicas
// and serves the frontend on the attached node.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=eng,categories=strata
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volumeName`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.currentState`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeID`
// +kubebuilder:printcolumn:name="InstanceManager",type=string,JSONPath=`.status.instanceManagerName`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Engine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EngineSpec   `json:"spec,omitempty"`
	Status EngineStatus `json:"status,omitempty"`
}

// EngineList is a list of engines.
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type EngineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Engine `json:"items"`
}
